"""Fake daemons in real subprocesses on real ipc sockets, always stopped afterwards."""

import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from jevany_client import JevClient, JevTimeoutError

FAKE_DAEMON = Path(__file__).with_name("fake_daemon.py")
READY_WITHIN_S = 20.0


@dataclass(frozen=True)
class Fake:
    endpoint: str
    control: str | None
    name: str
    process: subprocess.Popen


@contextmanager
def fake_daemon(directory: Path, name: str, control: bool = False, load: int | None = None,
                endpoint: str | None = None, state: str = "ready"):
    """endpoint: where it binds (default an ipc socket in directory); load: the load its replies report;
    state: what its status says."""
    endpoint = endpoint or f"ipc://{directory}/{name}.sock"
    control_endpoint = f"ipc://{directory}/{name}-control.sock" if control else None
    command = [sys.executable, str(FAKE_DAEMON), endpoint, "--name", name]
    if control_endpoint:
        command += ["--control", control_endpoint]
    if load is not None:
        command += ["--load", str(load)]
    command += ["--state", state]
    log = directory / f"{name}.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        _wait_ready(process, endpoint, log)
        yield Fake(endpoint, control_endpoint, name, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _wait_ready(process: subprocess.Popen, endpoint: str, log: Path) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    with JevClient(endpoint, timeout=0.2) as client:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"fake daemon exited {process.returncode}: {log.read_text()}")
            try:
                client.ping()
                return
            except JevTimeoutError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)    # the socket file may not exist yet: that fails at once


@pytest.fixture(scope="session")
def socket_dir():
    # ipc paths must fit in sun_path (about 107 bytes); pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="jvc-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon(socket_dir):
    """One fake daemon, public and control endpoints, shared by the client tests."""
    with fake_daemon(socket_dir, "alpha", control=True) as fake:
        yield fake


@pytest.fixture
def beta(socket_dir):
    """A second fake daemon, for clients connected to several endpoints."""
    with fake_daemon(socket_dir, "beta") as fake:
        yield fake


@pytest.fixture
def nowhere(socket_dir):
    """An ipc endpoint with no socket file behind it."""
    return f"ipc://{socket_dir}/nobody-home.sock"


@pytest.fixture(scope="session")
def stale(socket_dir):
    """An ipc endpoint whose socket file exists but nobody listens on (a daemon that died uncleanly)."""
    import socket

    path = socket_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))           # closed without unlink: the file stays, a connect is refused
    return f"ipc://{path}"
