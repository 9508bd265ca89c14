"""Daemons shared by the tests of one module, and daemons whose workers take injected faults."""
import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import msgpack
import zmq

from .daemons import Daemon

FAULTS = Path(__file__).resolve().parent / "faults"


def fault_env(triggers: Path) -> dict:
    """The environment that puts faults/sitecustomize.py into the daemon's workers, reading triggers there.

    The caller's own PYTHONPATH follows it, so a daemon runs the code the tests import (a worktree's,
    or a file scripts/mutate.py has mutated), not whatever copy the interpreter has installed."""
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "JEVANY_TEST_FAULT_DIR": str(triggers)}


@contextmanager
def running_daemon(model: Path, *args: str, env: dict | None = None, preexec=None, directory: Path | None = None):
    """A ready daemon for a module's tests; stopped (killed if it will not stop) and cleaned up after."""
    # ipc paths must stay short (about 100 bytes), so not under pytest's tmp_path
    directory = directory or Path(tempfile.mkdtemp(prefix="jvd-"))
    daemon = Daemon(directory, model, *args, env=env, preexec=preexec)
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(10)
        shutil.rmtree(daemon.dir, ignore_errors=True)


class Raw:
    """A bare DEALER: requests sent without waiting, replies read one by one (no client retries)."""

    def __init__(self, endpoint: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, rid, op: str, body: dict | None = None, **fields) -> None:
        message = {"v": 1, "id": rid, "op": op, **({"body": body} if body is not None else {}), **fields}
        self.sock.send(msgpack.packb(message))

    def recv(self, within_s: float = 60.0) -> dict:
        if not self.sock.poll(int(within_s * 1000)):
            raise AssertionError(f"no reply within {within_s}s")
        return msgpack.unpackb(self.sock.recv())

    def __enter__(self) -> "Raw":
        return self

    def __exit__(self, *exc) -> None:
        self.ctx.destroy(linger=0)


@contextmanager
def frozen(pid: int):
    """A process stopped (SIGSTOP) for the block: alive to the kernel, doing nothing; always resumed."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def serving_worker(daemon) -> dict:
    [worker] = [w for w in daemon.workers() if w["role"] == "serving"]
    return worker
