"""The rules a daemon's settings must meet that take more than one value or the host (no daemon).
test_settings.py checks them through resolve's sources; here the rules at their edges."""
import pytest

from jevany_daemon.server.settings import resolve
from jevany_daemon.server.validation import SettingsError, http_address, is_loopback


def test_an_http_address_takes_every_port_up_to_65535():
    assert http_address("127.0.0.1:65535") == ("127.0.0.1", 65535)
    assert http_address("[::1]:0") == ("::1", 0)
    with pytest.raises(ValueError, match="HOST:PORT"):
        http_address("127.0.0.1:65536")


@pytest.mark.parametrize("endpoint, loopback", [
    ("tcp://localhost:5555", True), ("tcp://127.0.0.5:5555", True), ("tcp://[::1]:5555", True),
    ("ipc:///tmp/x.sock", True), ("tcp://0.0.0.0:5555", False), ("tcp://*:5555", False),
    ("tcp://myhost:5555", False), ("tcp://[::]:5555", False)])
def test_loopback_is_ipc_or_a_loopback_tcp_address(endpoint, loopback):
    assert is_loopback(endpoint) is loopback


def test_localhost_is_served_without_curve_or_insecure():
    assert resolve({"bind": ("tcp://localhost:5555",), "http": "localhost:8008"}, None, env={}).http == "localhost:8008"


def test_an_abstract_control_socket_is_refused_and_a_path_is_taken():
    with pytest.raises(SettingsError, match="abstract socket"):
        resolve({"control": "ipc://@jevany-control"}, None, env={})
    assert resolve({"control": "ipc:///tmp/jevany-control.sock"}, None, env={}).control_endpoint \
        == "ipc:///tmp/jevany-control.sock"
