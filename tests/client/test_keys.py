"""Which CurveZMQ key arguments the client accepts: the daemon's key and the client's own pair, or none."""
import pytest

zmq = pytest.importorskip("zmq")

from jevany_client.keys import curve_keys  # noqa: E402

if not zmq.has("curve"):
    pytest.skip("this libzmq has no CURVE", allow_module_level=True)


@pytest.fixture
def pair():
    return zmq.curve_keypair()


def test_no_server_key_and_no_client_keys_is_a_plain_connection():
    assert curve_keys(None, None, None, None) is None


@pytest.mark.parametrize("given", ["secret_file", "public", "secret"])
def test_any_client_key_without_the_server_key_is_refused(given, tmp_path, pair):
    args = {"secret_file": None, "public": None, "secret": None}
    args[given] = str(tmp_path / "client.key_secret") if given == "secret_file" else pair[0].decode()
    with pytest.raises(ValueError, match="need server_public_key too"):
        curve_keys(None, **args)


def test_z85_keys_are_passed_on_as_bytes(pair):
    server, _ = zmq.curve_keypair()
    assert curve_keys(server.decode(), None, pair[0].decode(), pair[1].decode()) == (server, pair[0], pair[1])


def test_the_server_key_needs_the_clients_whole_pair(pair):
    server, _ = zmq.curve_keypair()
    with pytest.raises(ValueError, match="needs the client's own key pair"):
        curve_keys(server, None, pair[0], None)
    with pytest.raises(ValueError, match="not both"):
        curve_keys(server, "client.key_secret", pair[0], pair[1])


def test_a_key_that_is_not_40_characters_is_refused(pair):
    server, _ = zmq.curve_keypair()
    with pytest.raises(ValueError, match="40 characters of z85"):
        curve_keys(server, None, pair[0][:39], pair[1])


@pytest.mark.parametrize("odd", ["~", '"', "\\", ","])
def test_a_40_character_key_with_a_character_outside_z85_is_refused_with_the_same_message(pair, odd):
    server, _ = zmq.curve_keypair()
    with pytest.raises(ValueError, match="40 characters of z85"):
        curve_keys(server, None, odd + pair[0].decode()[1:], pair[1])
