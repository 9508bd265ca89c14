"""dns+tcp:// endpoints: what parses, and the tcp:// endpoints addresses become (no lookups here)."""
import pytest

from jevany_client.discovery import Named, is_ipv6, parse, tcp_endpoint


@pytest.mark.parametrize("endpoint, named", [
    ("dns+tcp://jevany:5555", Named("jevany", 5555)),
    ("dns+tcp://jevany:1", Named("jevany", 1)),
    ("dns+tcp://jevany:65535", Named("jevany", 65535)),
    ("dns+tcp://_zmq._tcp.jevany.ns.svc.cluster.local", Named("_zmq._tcp.jevany.ns.svc.cluster.local", None)),
])
def test_a_name_with_a_port_or_for_srv_records_parses(endpoint, named):
    assert parse(endpoint) == named
    assert named.endpoint == endpoint


@pytest.mark.parametrize("endpoint", ["dns+tcp://jevany:0", "dns+tcp://jevany:65536", "dns+tcp://jevany:port",
                                      "dns+tcp://:5555", "dns+tcp://a/b:5555", "dns+tcp://"])
def test_a_port_out_of_range_or_no_name_is_refused(endpoint):
    with pytest.raises(ValueError, match="dns\\+tcp://NAME:PORT"):
        parse(endpoint)


def test_an_ipv6_address_is_written_in_brackets_and_known_as_ipv6():
    assert tcp_endpoint("fd00::7", 5555) == "tcp://[fd00::7]:5555"
    assert tcp_endpoint("10.0.0.7", 5555) == "tcp://10.0.0.7:5555"
    assert is_ipv6("tcp://[fd00::7]:5555") and not is_ipv6("tcp://10.0.0.7:5555")
