"""systemd's notification protocol, spoken directly: one datagram per message to $NOTIFY_SOCKET.

Outside systemd (no NOTIFY_SOCKET) every call is a no-op. The watchdog
interval is half of $WATCHDOG_USEC, as sd_watchdog_enabled(3) advises, and
only when $WATCHDOG_PID is unset or names this process.
"""
import logging
import os
import socket

from jevany_daemon.logs import event

log = logging.getLogger("jevany.systemd")

# Variables systemd sets for the main process only; workers must not inherit them.
SYSTEMD_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    def __init__(self, env=os.environ):
        self.address = _address(env.get("NOTIFY_SOCKET"))
        self.watchdog_s = _watchdog_interval(env)
        self._sock = None
        self._failed = False
        if self.address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *lines: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            # systemd gone or the socket full: the daemon keeps serving; say so once.
            if not self._failed:
                event(log, "sd_notify_failed", level=logging.WARNING, error=exc)
            self._failed = True

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def reloading(self, monotonic_usec: int) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}", "STATUS=reloading")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _address(value: str | None):
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]      # Linux abstract namespace
    if value.startswith("/"):
        return value
    event(log, "sd_notify_ignored", level=logging.WARNING, notify_socket=value, reason="not a unix socket path")
    return None


def _watchdog_interval(env) -> float | None:
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 2 / 1_000_000


def worker_environment(env=os.environ) -> dict:
    """The environment for a worker: ours minus what systemd meant for the main process."""
    return {k: v for k, v in env.items() if k not in SYSTEMD_VARIABLES}
