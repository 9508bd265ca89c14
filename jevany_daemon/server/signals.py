"""Signals for the supervisor's loop.

Handlers only append the signal number to a list: logging or replying from a
handler would re-enter code the loop was in the middle of. set_wakeup_fd
writes a byte to a socketpair the loop polls, so poll() returns the moment a
signal lands and the loop acts on it in its own phase.
"""
import signal
import socket

import zmq

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class SignalFlags:
    def __init__(self, poller, handled=HANDLED):
        self._pending: list[int] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno())
        poller.register(self._wake_r.fileno(), zmq.POLLIN)
        for signum in handled:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self._pending.append(signum)

    def take(self) -> list[int]:
        """The signals that arrived since the last call, oldest first."""
        try:
            while self._wake_r.recv(64):
                pass
        except BlockingIOError:
            pass
        taken, self._pending = self._pending, []
        return taken

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        self._wake_r.close()
        self._wake_w.close()
