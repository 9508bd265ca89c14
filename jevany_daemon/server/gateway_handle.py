"""The HTTP gateway process as the supervisor sees it: its port, its socket, its life.

The supervisor binds the HTTP port (a clash is a start-up error, said plainly)
and a private ipc ROUTER the gateway speaks protocol v1 on; the gateway
process runs the HTTP stack. A gateway that exits is started again at once;
one that keeps dying is started again after a growing pause (up to
MAX_BACKOFF_S), so a broken install cannot spin. No HTTP code runs here.
"""
import logging
import os
import signal
import socket
import subprocess
import sys

import zmq

from jevany_daemon.inherited_settings import settings_fd
from jevany_daemon.logs import event
from jevany_daemon.media.policy import uploads_dir

from .sdnotify import worker_environment
from .sockets import StartupError
from .validation import http_address

log = logging.getLogger("jevany.supervisor")

STOP_WITHIN_S = 8.0       # uvicorn's graceful stop (5 s) and a margin, then SIGKILL
BACKLOG = 2048            # connections that may wait while a gateway starts or is replaced
MAX_BACKOFF_S = 5.0
STABLE_AFTER_S = 10.0     # a gateway that lived this long resets the backoff


class GatewayProcess:
    def __init__(self, ctx, poller, rundir: str, settings, clock):
        self.settings, self.clock, self.poller = settings, clock, poller
        self.address = settings.http
        self.listener = _listen(settings.http)
        self.endpoint = f"ipc://{rundir}/gateway.sock"
        self.rundir = rundir
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, settings.max_message_bytes)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.bind(self.endpoint)
        poller.register(self.sock, zmq.POLLIN)
        self.proc: subprocess.Popen | None = None
        self.sentinel: int | None = None
        self.restarts = 0
        self.started_at = 0.0
        self.next_start: float | None = None
        self.backoff_s = 0.0
        self.metrics_url: str | None = None

    def start(self, metrics_url: str | None) -> None:
        self.metrics_url = metrics_url
        self._spawn()

    def _spawn(self) -> None:
        fd = self.listener.fileno()
        settings = settings_fd(self.settings.to_dict())     # not on its command line, which anyone may read
        argv = [sys.executable, "-m", "jevany_daemon.gateway", "--upstream", self.endpoint, "--fd", str(fd),
                "--settings-fd", str(settings), "--parent", str(os.getpid())]
        if self.metrics_url:
            argv += ["--metrics-url", self.metrics_url]
        if self.settings.media_root:
            argv += ["--uploads", uploads_dir(self.rundir)]    # MediaChecks made it; images sent in bodies go there
        # Its own session: a Ctrl-C at the terminal reaches the supervisor, which drains, and
        # stops the gateway only after every HTTP caller has had its reply.
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=(fd, settings),
                                         env=worker_environment(os.environ), start_new_session=True)
        finally:
            os.close(settings)
        self.started_at, self.next_start = self.clock(), None
        try:
            self.sentinel = os.pidfd_open(self.proc.pid)
            self.poller.register(self.sentinel, zmq.POLLIN)
        except (AttributeError, OSError):   # no pidfd: the exit is noticed on the next poll timeout
            self.sentinel = None
        event(log, "gateway_spawn", pid=self.proc.pid, http=self.address, restarts=self.restarts)

    def watch(self, restart: bool = True) -> None:
        """Notice an exit and start a successor, after the backoff if it keeps dying (unless restart is off)."""
        now = self.clock()
        if self.proc is not None and self.proc.poll() is not None:
            code = self.proc.returncode
            self._forget_sentinel()
            lived = now - self.started_at
            self.backoff_s = 0.0 if lived >= STABLE_AFTER_S else min(MAX_BACKOFF_S, max(0.25, self.backoff_s * 2))
            event(log, "gateway_exit", level=logging.WARNING, pid=self.proc.pid, code=code,
                  lived_s=round(lived, 3), restart_in_s=self.backoff_s)
            self.proc, self.next_start = None, now + self.backoff_s
            self.restarts += 1
        if not restart:
            self.next_start = None
        if self.proc is None and self.next_start is not None and now >= self.next_start:
            self._spawn()

    def wait_s(self) -> float | None:
        """How soon the loop must wake to start a successor."""
        if self.proc is None and self.next_start is not None:
            return max(0.0, self.next_start - self.clock())
        return None

    def describe(self) -> dict:
        return {"address": f"http://{self.address}", "pid": self.proc.pid if self.proc else None,
                "state": "up" if self.proc is not None else "restarting", "restarts": self.restarts}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._forget_sentinel()
        self.proc = None
        self.next_start = None

    def close(self) -> None:
        self.stop()
        self.sock.close()
        self.listener.close()

    def _forget_sentinel(self) -> None:
        if self.sentinel is not None:
            self.poller.unregister(self.sentinel)
            os.close(self.sentinel)
            self.sentinel = None


def _listen(address: str) -> socket.socket:
    host, port = http_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        listener = socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as exc:
        raise StartupError(f"cannot serve HTTP on {address} (--http): {exc.strerror or exc}; "
                           "stop what holds it or choose another --http") from None
    listener.set_inheritable(True)
    return listener
