"""Real daemons for the reliability tests: one shared by most modules, and per-module ones; always stopped."""
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.server.daemons import Daemon

from .harness import ARCH, READOUT, reference_answers


SHARED_MESSAGE_LIMIT = 64 << 10


def _daemons(tiny_model):
    """Yield start(*serve_args) -> a ready Daemon on the tiny pointer model.

    Teardown stops each with SIGTERM and checks that it drained and exited 0:
    whatever the tests threw at it, it must still shut down cleanly.
    """
    started = []

    def start(*args: str) -> Daemon:
        daemon = Daemon(Path(tempfile.mkdtemp(prefix="jvr-")), tiny_model(ARCH, READOUT), *args)
        started.append(daemon)
        daemon.wait_ready()
        return daemon

    yield start
    codes = []
    for daemon in started:
        try:
            codes.append(daemon.stop() if daemon.proc.poll() is None else daemon.proc.returncode)
        finally:
            shutil.rmtree(daemon.dir, ignore_errors=True)
    assert all(code == 0 for code in codes), f"daemon exit codes {codes}"


@pytest.fixture(scope="module")
def module_daemon(tiny_model):
    """module_daemon(*serve_args) -> a ready Daemon of the module's own."""
    yield from _daemons(tiny_model)


@pytest.fixture(scope="package")
def shared_daemon(tiny_model):
    """One daemon for the fuzz, load, slow-client, soak and Node.js tests (batching on, 64 KiB messages).

    Sharing saves a model load per module on a 2-core CI machine; every test
    measures differences (counters, RSS, fds) from its own start, and checks
    the worker was never restarted.
    """
    for start in _daemons(tiny_model):
        yield start("--max-batch-size", "8", "--max-message-bytes", str(SHARED_MESSAGE_LIMIT))


@pytest.fixture(scope="module")
def reference(loaded_model):
    """reference(bodies) -> serial in-process answers from the model the daemons serve."""
    return lambda bodies: reference_answers(loaded_model(ARCH, READOUT), bodies)
