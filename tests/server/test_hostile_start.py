"""Start-up under hostile local users: a socket directory someone else could swap, an abstract
or TCP control endpoint any local user could drain the daemon through. Each is refused, with why, before
a worker starts; the real command line, so the exit code is what an operator sees."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REFUSED_WITHIN_S = 30       # a refusal comes before any model loads; a daemon that starts takes longer


def serve(*args, model) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "jevany_daemon", "serve", "--model", str(model), *args],
                              capture_output=True, text=True, timeout=REFUSED_WITHIN_S)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the daemon was not refused; it started:\n{exc.stderr}") from None


@pytest.fixture
def place():
    # ipc paths must stay short, so not under pytest's tmp_path
    directory = Path(tempfile.mkdtemp(prefix="jvs-"))
    yield directory
    subprocess.run(["rm", "-rf", str(directory)], check=False)


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory another user owns needs root")
def test_a_socket_directory_another_user_made_first_is_refused_with_why(tiny_model, place):
    # /tmp/jevany-UID, made by someone else before the daemon (mode 0777): they could swap jevany/ inside
    # later and serve a daemon of their own on the victim's default socket.
    shared = place / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "jevany-1000"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    theirs.chmod(0o777)
    done = serve("--bind", f"ipc://{theirs}/jevany/daemon.sock", "--control", "", model=tiny_model("qwen3", "choice"))
    assert done.returncode == 1
    why = f"refusing to serve on ipc://{theirs}/jevany/daemon.sock (--bind): {theirs} belongs to uid 65534"
    assert why in done.stderr
    assert "Traceback" not in done.stderr and not (theirs / "jevany").exists()


def test_a_socket_directory_others_may_write_is_refused_with_why(tiny_model, place):
    loose = place / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    done = serve("--bind", f"ipc://{loose}/jevany/daemon.sock", "--control", "", model=tiny_model("qwen3", "choice"))
    assert done.returncode == 1 and f"{loose} is writable by others (mode 0777)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("control,why", [
    ("ipc://@jevany-control-test", "is an abstract socket, which every local user may connect to"),
    ("tcp://127.0.0.1:5599", "would let every local user drain or reload the daemon"),
])
def test_a_control_endpoint_every_local_user_could_reach_is_refused(tiny_model, place, control, why):
    done = serve("--bind", f"ipc://{place}/d.sock", "--control", control, model=tiny_model("qwen3", "choice"))
    assert done.returncode == 2 and why in done.stderr


def test_metrics_off_loopback_need_insecure(tiny_model, place):
    done = serve("--bind", f"ipc://{place}/d.sock", "--control", "", "--metrics-port", "0", "--metrics-host",
                 "0.0.0.0", model=tiny_model("qwen3", "choice"))
    assert done.returncode == 2 and "unauthenticated, to anyone who can reach it" in done.stderr
