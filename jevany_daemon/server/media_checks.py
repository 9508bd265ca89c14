"""Media requests on their way in: checked by the media checker process before they are queued.

The supervisor never opens a media file. A decide request with media waits
here (not in the queue) while the checker process applies the media policy
to it, one request at a time; text requests pass straight by. A check that
runs past --media-check-timeout, or a checker that dies, costs that one
request a typed refusal ("media file could not be validated"; a checker that
died under a request gets one more try first) and the checker is started
again (after a growing pause if it keeps dying before saying hello); the
requests behind it go on to the new one. Nothing here
waits: sends never block, and a killed checker is reaped on later turns.
"""
import logging
import os
import signal
import subprocess
import sys
from collections import deque
from itertools import count

import msgpack
import zmq

from jevany_daemon.media.policy import uploads_dir

from jevany_daemon.inherited_settings import settings_fd
from jevany_daemon.logs import event

log = logging.getLogger("jevany.supervisor")

COULD_NOT_VALIDATE = "media file could not be validated"
HELLO_WITHIN_S = 30.0       # a checker that has not said hello by then is replaced
MAX_BACKOFF_S = 5.0
MAX_FAILED_STARTS = 5       # then the requests waiting are refused rather than kept


class MediaChecks:
    def __init__(self, ctx, poller, rundir: str, settings, clock):
        self.settings, self.poller, self.clock = settings, poller, clock
        self.endpoint = f"ipc://{rundir}/media.sock"
        self.uploads = uploads_dir(rundir)
        os.makedirs(self.uploads, mode=0o700, exist_ok=True)     # the gateway writes uploaded images here
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
        self.failed_starts = 0             # checkers in a row that died before their hello
        self.next_start: float | None = None
        self.backoff_s = 0.0
        self._reaping: list[subprocess.Popen] = []
        self._retried: set = set()         # tags of requests whose checker died under them once
        self._serials = count()
        self._spawn()

    def pending(self) -> int:
        """Requests waiting for, or in, a check."""
        return len(self.waiting) + (self.current is not None)

    def entries(self) -> list:
        return [e for e, _ in self.waiting] + ([self.current[0]] if self.current is not None else [])

    def _spawn(self) -> None:
        name = f"media.{next(self._serials)}"
        settings = settings_fd(self.settings.to_dict())     # not on its command line, which anyone may read
        argv = [sys.executable, "-m", "jevany_daemon.media.checker", "--endpoint", self.endpoint,
                "--identity", name, "--settings-fd", str(settings), "--uploads", self.uploads,
                "--parent", str(os.getpid())]
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=(settings,))
        finally:
            os.close(settings)
        self.expected, self.identity = name.encode(), None
        self.hello_by, self.next_start = self.clock() + HELLO_WITHIN_S, None

    def submit(self, entry, items: list) -> None:
        self.waiting.append((entry, items))
        self._send_next()

    def _send_next(self) -> None:
        if self.current is not None or not self.waiting or self.identity is None:
            return
        entry, items = self.waiting.popleft()
        try:
            self.sock.send_multipart([self.identity, msgpack.packb([entry.tag, items])], zmq.NOBLOCK)
        except zmq.ZMQError:
            # The checker went away since its hello (watch() has not seen it yet): this request
            # waits for the next one, first in line.
            self.waiting.appendleft((entry, items))
            self.identity = None
            return
        self.current = (entry, items, self.clock() + self.settings.media_check_timeout)

    def next_deadline(self) -> float | None:
        """When the loop must look again: the check's deadline, a waiting request's, a restart."""
        times = [e.deadline for e, _ in self.waiting if e.deadline is not None]
        if self.current is not None:
            times.append(self.current[2])
        if self.next_start is not None:
            times.append(self.next_start)
        return min(times, default=None)

    def receive(self, ready: dict) -> list:
        """Finished checks: [(entry, ok, resolved [[type, path]...] or message)]."""
        done = []
        if ready is not None and self.sock not in ready:
            return done
        while True:
            try:
                ident, payload = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:
                continue
            try:
                message = msgpack.unpackb(payload, raw=False)
            except ValueError:
                continue
            if ident != self.expected or not isinstance(message, list):
                continue                 # a killed checker's late words
            if message == ["hello"]:
                self.identity, self.failed_starts, self.backoff_s = ident, 0, 0.0
            elif self.current is not None and len(message) == 3 and message[0] == self.current[0].tag:
                done.append((self.current[0], message[1], message[2]))
                self._retried.discard(message[0])
                self.current = None
        self._send_next()
        return done

    def watch(self) -> list:
        """A check past its deadline, a checker that died or never said hello: that request refused,
        a new checker (after a pause while they keep failing to start)."""
        self._reaping = [p for p in self._reaping if p.poll() is None]
        now, failed = self.clock(), []
        if self.proc is not None:
            overdue = self.current is not None and now > self.current[2]
            silent = self.identity is None and now > self.hello_by
            if overdue or silent or self.proc.poll() is not None:
                cause = ("check timed out" if overdue else "no hello" if silent
                         else f"exited {self.proc.returncode}")
                if self.current is not None:
                    entry, items, _ = self.current
                    if overdue or entry.tag in self._retried:
                        failed.append((entry, False, COULD_NOT_VALIDATE))
                        self._retried.discard(entry.tag)
                    else:
                        # The checker died under it, which may not be this file's doing (a kill, an
                        # OOM elsewhere): one more try on the next checker; dying twice is the file's.
                        self._retried.add(entry.tag)
                        self.waiting.appendleft((entry, items))
                    self.current = None
                if self.identity is None:
                    self.failed_starts += 1
                    self.backoff_s = min(MAX_BACKOFF_S, max(0.25, self.backoff_s * 2))
                self._kill()
                self.restarts += 1
                event(log, "media_checker_restart", level=logging.WARNING, cause=cause, restarts=self.restarts)
                self.next_start = now + (self.backoff_s if self.identity is None else 0.0)
                self.identity = None
                if self.failed_starts >= MAX_FAILED_STARTS:
                    failed += [(e, False, COULD_NOT_VALIDATE) for e in self.close_waiting()]
        if self.proc is None and self.next_start is not None and now >= self.next_start:
            self._spawn()
        return failed

    def take_expired(self, now: float) -> list:
        """Waiting requests whose deadline passed (the one being checked finishes first)."""
        expired = [(e, i) for e, i in self.waiting if e.deadline is not None and e.deadline <= now]
        for item in expired:
            self.waiting.remove(item)
        return [e for e, _ in expired]

    def close_waiting(self) -> list:
        """Take every request not yet being checked (a stop that will not wait for them)."""
        left = [e for e, _ in self.waiting]
        self.waiting.clear()
        return left

    def _kill(self) -> None:
        # SIGKILL, never a wait: a checker stuck in the kernel (a hung network mount) must not
        # hold the loop. It is reaped on later turns.
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self._reaping.append(self.proc)
        self.proc = None

    def close(self) -> None:
        self.current, self.waiting = None, deque()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(2)          # at exit: a short wait, then SIGKILL and go
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.sock.close()
