"""Media requests on their way in: checked by the media checker process before they are queued.

The supervisor never opens a media file. A decide request with media waits
here (not in the queue) while the checker process applies the media policy
to it, one request at a time; text requests pass straight by. A check that
runs past --media-check-timeout, or a checker that dies, costs that one request a
typed refusal ("media file could not be validated") and the checker is
started again; the requests behind it go on to the new one.
"""
import json
import logging
import signal
import subprocess
import sys
from collections import deque
from itertools import count

import msgpack
import zmq

from .logs import event

log = logging.getLogger("jevany.supervisor")

COULD_NOT_VALIDATE = "media file could not be validated"


class MediaChecks:
    def __init__(self, ctx, poller, rundir: str, settings, clock):
        self.settings, self.poller, self.clock = settings, poller, clock
        self.endpoint = f"ipc://{rundir}/media.sock"
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.bind(self.endpoint)
        poller.register(self.sock, zmq.POLLIN)
        self.waiting: deque = deque()      # (entry, items) not yet sent
        self.current = None                # (entry, items, deadline) being checked
        self.proc: subprocess.Popen | None = None
        self.identity: bytes | None = None  # set by the checker's hello
        self.restarts = 0
        self._serials = count()
        self._spawn()

    def pending(self) -> int:
        """Requests waiting for, or in, a check."""
        return len(self.waiting) + (self.current is not None)

    def _spawn(self) -> None:
        name = f"media.{next(self._serials)}"
        argv = [sys.executable, "-m", "jevany_daemon.media.checker", "--endpoint", self.endpoint,
                "--identity", name, "--settings", json.dumps(self.settings.to_dict())]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        self.expected, self.identity = name.encode(), None

    def submit(self, entry, items: list) -> None:
        self.waiting.append((entry, items))
        self._send_next()

    def _send_next(self) -> None:
        if self.current is not None or not self.waiting or self.identity is None:
            return
        entry, items = self.waiting.popleft()
        self.current = (entry, items, self.clock() + self.settings.media_check_timeout)
        self.sock.send_multipart([self.identity, msgpack.packb([entry.tag, items])])

    def receive(self, ready: dict) -> list:
        """Finished checks: [(entry, ok, resolved [[type, path]...] or message)]."""
        done = []
        if self.sock not in ready:
            return done
        while True:
            try:
                ident, payload = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            message = msgpack.unpackb(payload, raw=False)
            if ident != self.expected:
                continue                 # a killed checker's late words
            if message == ["hello"]:
                self.identity = ident
            elif self.current is not None and message[0] == self.current[0].tag:
                done.append((self.current[0], message[1], message[2]))
                self.current = None
        self._send_next()
        return done

    def watch(self) -> list:
        """A check past its deadline, or a checker that died: that request refused, a new checker."""
        failed = []
        overdue = self.current is not None and self.clock() > self.current[2]
        if overdue or self.proc.poll() is not None:
            cause = "check timed out" if overdue else f"exited {self.proc.returncode}"
            if self.current is not None:
                failed.append((self.current[0], False, COULD_NOT_VALIDATE))
                self.current = None
            self._stop(signal.SIGKILL)
            self.restarts += 1
            event(log, "media_checker_restart", level=logging.WARNING, cause=cause, restarts=self.restarts)
            self._spawn()
        return failed

    def take_expired(self, now: float) -> list:
        """Waiting requests whose deadline passed (the one being checked finishes first)."""
        expired = [(e, i) for e, i in self.waiting if e.deadline is not None and e.deadline <= now]
        for item in expired:
            self.waiting.remove(item)
        return [e for e, _ in expired]

    def _stop(self, sig=signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close_waiting(self) -> list:
        """Take every request not yet being checked (a stop that will not wait for them)."""
        left = [e for e, _ in self.waiting]
        self.waiting.clear()
        return left

    def close(self) -> list:
        """Stop the checker; whatever still waits is returned, to be answered."""
        left = [e for e, *_ in ([self.current] if self.current else [])] + [e for e, _ in self.waiting]
        self.current, self.waiting = None, deque()
        self._stop()
        self.sock.close()
        return left
