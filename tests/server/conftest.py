"""Real daemons in real processes on real ipc sockets, always stopped afterwards."""
import shutil
import tempfile
from pathlib import Path

import pytest

from .daemons import Daemon

TINY = object()


@pytest.fixture
def start_daemon(tiny_model):
    """start_daemon(*serve_args, readout="pointer") -> a ready Daemon, stopped after the test.

    model=None leaves --model out (a --config file names it); env adds variables.
    """
    started = []

    def start(*args, arch="qwen3", readout="pointer", ready=True, model=TINY, env=None):
        # ipc paths must stay short (about 100 bytes), so not under tmp_path
        directory = Path(tempfile.mkdtemp(prefix="jvd-"))
        daemon = Daemon(directory, tiny_model(arch, readout) if model is TINY else model, *args, env=env)
        started.append(daemon)
        if ready:
            daemon.wait_ready()
        return daemon

    yield start
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(10)
        shutil.rmtree(daemon.dir, ignore_errors=True)
