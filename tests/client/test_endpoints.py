import os
import subprocess
import sys
from pathlib import Path

from jevany_client.endpoints import (
    default_control_endpoint,
    default_endpoint,
    ipc_path,
    runtime_dir,
)


def test_runtime_dir_prefers_xdg_runtime_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert runtime_dir() == tmp_path


def test_runtime_dir_falls_back_to_a_per_user_tmp_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert runtime_dir() == Path(f"/tmp/jevany-{os.getuid()}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert runtime_dir() == Path(f"/tmp/jevany-{os.getuid()}")


def test_defaults_are_ipc_sockets_in_the_runtime_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("JEVANY_ENDPOINT", raising=False)
    monkeypatch.delenv("JEVANY_CONTROL_ENDPOINT", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_endpoint() == f"ipc://{tmp_path}/jevany/daemon.sock"
    assert default_control_endpoint() == f"ipc://{tmp_path}/jevany/control.sock"


def test_environment_overrides_the_defaults(monkeypatch):
    monkeypatch.setenv("JEVANY_ENDPOINT", "tcp://127.0.0.1:7000")
    monkeypatch.setenv("JEVANY_CONTROL_ENDPOINT", "ipc:///run/jv/control.sock")
    assert default_endpoint() == "tcp://127.0.0.1:7000"
    assert default_control_endpoint() == "ipc:///run/jv/control.sock"


def test_empty_environment_values_mean_unset(monkeypatch, tmp_path):
    monkeypatch.setenv("JEVANY_ENDPOINT", "")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_endpoint() == f"ipc://{tmp_path}/jevany/daemon.sock"


def test_ipc_path():
    assert ipc_path("ipc:///run/jevany/daemon.sock") == Path("/run/jevany/daemon.sock")
    assert ipc_path("ipc://relative.sock") == Path("relative.sock")
    assert ipc_path("ipc://@abstract") is None
    assert ipc_path("ipc://") is None
    assert ipc_path("tcp://127.0.0.1:5555") is None


def test_endpoints_module_stays_tiny():
    code = (
        "import sys, jevany_client.endpoints\n"
        "print(sorted({'zmq', 'typer', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_client_refuses_an_endpoint_it_cannot_use_when_made_saying_the_form_meant():
    import pytest

    from jevany_client import JevClient

    for typed, advice in (("localhost:5555", "did you mean tcp://localhost:5555?"),
                          ("/run/x.sock", "did you mean ipc:///run/x.sock?"),
                          ("https://h:8008/v1", "that is an HTTP URL")):
        with pytest.raises(ValueError, match="endpoints are ipc://PATH or tcp://HOST:PORT") as caught:
            JevClient(typed)
        assert advice in str(caught.value)
    for usable in ("ipc:///tmp/x.sock", "ipc://@abstract", "tcp://127.0.0.1:5555", "tcp://[::1]:5555",
                   "dns+tcp://jevany:5555", "inproc://here"):
        JevClient(usable).close()
