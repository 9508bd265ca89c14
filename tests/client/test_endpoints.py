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


def test_a_tcp_port_is_1_to_65535_and_star_is_for_binding_only():
    import pytest

    from jevany_client.endpoints import check_endpoint

    for usable in ("tcp://h:1", "tcp://h:65535"):
        check_endpoint(usable)
    for typed, advice in (("tcp://h:0", "write tcp://HOST:PORT"), ("tcp://h:65536", "write tcp://HOST:PORT"),
                          ("tcp://*:5555", "* is for binding; connect to the daemon's host: tcp://HOST:5555")):
        with pytest.raises(ValueError, match="cannot use the endpoint") as caught:
            check_endpoint(typed)
        assert advice in str(caught.value)


def test_no_daemon_is_said_only_when_every_endpoint_is_a_missing_socket_file(tmp_path):
    from jevany_client.endpoints import missing_sockets

    here, gone = f"ipc://{tmp_path}/here.sock", f"ipc://{tmp_path}/gone.sock"
    (tmp_path / "here.sock").write_bytes(b"")           # existence is all that is asked
    assert missing_sockets([here, gone]) is None
    assert missing_sockets([gone, "tcp://127.0.0.1:5555"]) is None
    problem = missing_sockets([gone, f"ipc://{tmp_path}/also.sock"])
    assert problem.startswith(f"no daemon at {tmp_path}/gone.sock, {tmp_path}/also.sock: no socket file there")


def test_a_socket_in_a_directory_others_may_write_is_refused_before_anything_is_sent(tmp_path):
    from jevany_client.endpoints import missing_sockets

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    problem = missing_sockets([f"ipc://{shared}/daemon.sock"])
    assert problem.startswith(f"refusing to use ipc://{shared}/daemon.sock: {shared} is writable by others")
