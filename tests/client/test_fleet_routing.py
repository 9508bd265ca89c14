"""Routing over several fake daemons, and discovery through a real DNS server on loopback.

Each fake daemon is a real process on a real socket; the DNS server is a real
UDP server in this process (dnspython's messages), whose records a test changes.
"""
import asyncio
import socket
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import dns.message
import dns.rcode
import dns.rrset
import pytest

from jevany_client import AsyncJevClient, Choice, JevClient, decide_body, fleet, routing

from .conftest import fake_daemon

QUESTIONS = {"pick": Choice(["red", "blue"])}
WITHIN_S = 30.0          # a bound on each wait, not a speed check


def decided(fake) -> int:
    with JevClient(fake.endpoint, timeout=5.0) as probe:
        return probe.status()["decided"]


def reach_all(client: JevClient, names: set[str]) -> None:
    """Ping until every daemon has answered one: all connected before the routing is judged."""
    seen, deadline = set(), time.monotonic() + WITHIN_S
    while seen != names:
        assert time.monotonic() < deadline, f"only {seen} of {names} reached"
        seen.add(client.ping()["server"])


@pytest.mark.parametrize("client", ["JevClient", "AsyncJevClient"])
def test_a_daemon_answering_shutting_down_leaves_the_pool_at_once(socket_dir, client):
    states = [{"refuse_on": "leaving", "error": "shutting_down", "n": n} for n in range(10)]

    async def decide_async(endpoints):
        async with AsyncJevClient(endpoints, timeout=10.0, retries=2, routing="round_robin") as ajc:
            seen = set()
            while seen != {"leaving", "staying"}:
                seen.add((await ajc.ping())["server"])
            return [(await ajc.decide(state, QUESTIONS))["server"] for state in states]

    with fake_daemon(socket_dir, "leaving") as leaving, fake_daemon(socket_dir, "staying") as staying:
        endpoints = [leaving.endpoint, staying.endpoint]
        if client == "JevClient":
            with JevClient(endpoints, timeout=10.0, retries=2, routing="round_robin") as jc:
                reach_all(jc, {"leaving", "staying"})
                servers = [jc.decide(state, QUESTIONS)["server"] for state in states]
        else:
            servers = asyncio.run(asyncio.wait_for(decide_async(endpoints), WITHIN_S))
        assert servers == ["staying"] * 10          # the one refused was retried on the other
        assert decided(leaving) == 1                # and nothing went there after its refusal


def test_least_loaded_sends_no_more_to_a_daemon_that_reports_a_long_queue(socket_dir):
    with (fake_daemon(socket_dir, "busy", load=50) as busy, fake_daemon(socket_dir, "idle1", load=0) as one,
          fake_daemon(socket_dir, "idle2", load=0) as two):
        with JevClient([busy.endpoint, one.endpoint, two.endpoint], timeout=10.0) as client:
            assert client.routing == "least_loaded"
            reach_all(client, {"busy", "idle1", "idle2"})
            pinged = client.shares()
            servers = [client.decide({"n": n}, QUESTIONS)["server"] for n in range(30)]
            shares = client.shares()
        assert servers.count("busy") <= 1           # at most once, before its first report came
        assert {"idle1", "idle2"} <= set(servers)
        assert shares[busy.endpoint] - pinged[busy.endpoint] == decided(busy) <= 1


def test_affinity_keeps_each_state_on_one_daemon_and_spreads_the_states(socket_dir):
    names = {"a1", "a2", "a3"}
    with fake_daemon(socket_dir, "a1") as a, fake_daemon(socket_dir, "a2") as b, fake_daemon(socket_dir, "a3") as c:
        with JevClient([a.endpoint, b.endpoint, c.endpoint], timeout=10.0, routing="affinity") as client:
            reach_all(client, names)
            homes = {}
            for turn in range(3):
                for session in range(12):
                    # a transcript that grows every turn, past the key's first kilobyte
                    state = {"session": session, "transcript": f"session {session} " * 120 + "more " * turn}
                    homes.setdefault(session, set()).add(client.decide(state, QUESTIONS)["server"])
    assert all(len(servers) == 1 for servers in homes.values()), homes
    assert len(set().union(*homes.values())) >= 2


def test_a_daemon_whose_handshake_has_not_finished_is_waited_for_not_skipped(socket_dir, monkeypatch):
    # A listener that never speaks ZMTP: the connection is made (the kernel's backlog) but its
    # handshake never finishes, like a daemon too busy to greet. The key's request must wait the
    # connect grace for it before going elsewhere, as for a connection not yet made.
    monkeypatch.setattr(fleet, "CONNECT_GRACE_S", 1.0)
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # a folder of its own: socket_dir is shared by the worker's session, and a fake daemon named
    # "mute" elsewhere (test_eval_exits) leaves a socket file of that name behind when it is stopped
    path = Path(tempfile.mkdtemp(dir=socket_dir)) / "mute.sock"
    mute.bind(str(path))
    mute.listen(8)
    try:
        with fake_daemon(socket_dir, "greets") as greets:
            endpoints = [f"ipc://{path}", greets.endpoint]
            ring = routing.make_policy("affinity")
            peers = [SimpleNamespace(key=e, load=lambda now: 0) for e in endpoints]
            state = next(s for s in ({"n": n} for n in range(1000))
                         if ring.choose(peers, routing.affinity_key(s), 0.0).key == endpoints[0])
            with JevClient(endpoints, timeout=WITHIN_S, routing="affinity") as client:
                started = time.monotonic()
                assert client.decide(state, QUESTIONS)["server"] == "greets"
                assert time.monotonic() - started >= 0.9 * fleet.CONNECT_GRACE_S
    finally:
        mute.close()
        path.unlink(missing_ok=True)


def test_an_explicit_affinity_key_keeps_different_states_together_on_the_async_client(socket_dir):
    async def main(endpoints):
        async with AsyncJevClient(endpoints, timeout=10.0, routing="affinity") as client:
            seen = set()
            while len(seen) < 3:
                seen.add((await client.ping())["server"])
            together = [(await client.decide({"turn": n}, QUESTIONS, affinity="agent-7"))["server"]
                        for n in range(12)]
            apart = {(await client.decide({"turn": n}, QUESTIONS))["server"] for n in range(24)}
            # six at once on one key: past its bound (c = 1.25) the key spills to the next daemon
            many = await client.decide_many([decide_body({"n": n}, QUESTIONS) for n in range(6)],
                                            affinity="agent-7")
            return together, apart, [r["server"] for r in many]

    with fake_daemon(socket_dir, "k1") as a, fake_daemon(socket_dir, "k2") as b, fake_daemon(socket_dir, "k3") as c:
        together, apart, many = asyncio.run(asyncio.wait_for(main([a.endpoint, b.endpoint, c.endpoint]), WITHIN_S))
    [home] = set(together)
    assert len(apart) >= 2                          # short states of their own: keyed apart
    # home takes 1st, 3rd and 5th; the 2nd, 4th and 6th find it at ceil(1.25 * (sent + 1) / 3)
    assert many[0::2] == [home] * 3 and len(set(many[1::2])) == 1 and home not in many[1::2]


def test_a_bad_routing_name_is_refused_by_both_clients():
    for make in (JevClient, AsyncJevClient):
        with pytest.raises(ValueError, match="routing must be one of"):
            make(["ipc:///a", "ipc:///b"], routing="fastest")


# -- discovery --------------------------------------------------------------------------------


class DnsServer:
    """A DNS server on loopback UDP answering from `records` {(name, type): [value]}; NXDOMAIN else."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], list[str]] = {}
        self.queries = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stopping.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            query = dns.message.from_wire(data)
            self.queries += 1
            reply = dns.message.make_response(query)
            question = query.question[0]
            name, kind = question.name.to_text(), dns.rdatatype.to_text(question.rdtype)
            values = self.records.get((name, kind), [])
            if values:
                reply.answer.append(dns.rrset.from_text_list(name, 1, "IN", kind, values))
            elif not any(known == name for known, _ in self.records):
                reply.set_rcode(dns.rcode.NXDOMAIN)
            self.sock.sendto(reply.to_wire(), peer)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def dns_server(monkeypatch):
    server = DnsServer()
    monkeypatch.setenv("JEVANY_DNS_SERVER", server.address)
    yield server
    server.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def servers_of(client: JevClient, n: int) -> set[str]:
    return {client.decide({"n": k}, QUESTIONS)["server"] for k in range(n)}


def until(client: JevClient, wanted, what: str) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not wanted(servers_of(client, 12)):
        assert time.monotonic() < deadline, what


def test_addresses_join_and_leave_as_the_records_change(socket_dir, dns_server):
    port, name = free_port(), "fleet.test."
    hosts = {f"d{i}": f"127.0.0.{i}" for i in (1, 2, 3)}
    dns_server.records[(name, "A")] = [hosts["d1"], hosts["d2"]]
    fakes = [fake_daemon(socket_dir, n, endpoint=f"tcp://{ip}:{port}") for n, ip in hosts.items()]
    with fakes[0], fakes[1], fakes[2]:
        with JevClient(f"dns+tcp://fleet.test:{port}", timeout=10.0, routing="round_robin",
                       resolve_every=0.2) as client:
            until(client, lambda seen: seen == {"d1", "d2"}, "both listed daemons answer")
            dns_server.records[(name, "A")] = [hosts["d1"], hosts["d2"], hosts["d3"]]
            until(client, lambda seen: seen == {"d1", "d2", "d3"}, "the new daemon joins")
            dns_server.records[(name, "A")] = [hosts["d2"], hosts["d3"]]
            until(client, lambda seen: "d1" not in seen, "the removed daemon drains out")
            assert servers_of(client, 30) == {"d2", "d3"}
            assert set(client.shares()) == {f"tcp://{hosts['d2']}:{port}", f"tcp://{hosts['d3']}:{port}"}
            dns_server.records.clear()                      # the name is gone: what it had is kept
            asked, deadline = dns_server.queries, time.monotonic() + WITHIN_S
            while dns_server.queries < asked + 4:           # two lookups (A and AAAA each) since
                assert servers_of(client, 4) <= {"d2", "d3"} and time.monotonic() < deadline
            assert servers_of(client, 12) == {"d2", "d3"}


def test_srv_records_name_the_daemons_and_their_ports(socket_dir, dns_server):
    ports = {"s1": free_port(), "s2": free_port()}
    dns_server.records[("_zmq._tcp.fleet.test.", "SRV")] = [f"0 0 {p} localhost." for p in ports.values()]
    fakes = [fake_daemon(socket_dir, n, endpoint=f"tcp://127.0.0.1:{p}") for n, p in ports.items()]
    with fakes[0], fakes[1]:
        with JevClient("dns+tcp://_zmq._tcp.fleet.test", timeout=10.0, routing="round_robin") as client:
            until(client, lambda seen: seen == {"s1", "s2"}, "both daemons answer")
            assert set(client.shares()) == {f"tcp://localhost:{p}" for p in ports.values()}


def test_the_system_resolver_finds_localhost_for_both_clients(socket_dir):
    port = free_port()
    with fake_daemon(socket_dir, "local", endpoint=f"tcp://127.0.0.1:{port}"):
        with JevClient(f"dns+tcp://localhost:{port}", timeout=10.0) as client:
            assert client.decide("hello", QUESTIONS)["server"] == "local"

        async def main():
            async with AsyncJevClient(f"dns+tcp://localhost:{port}", timeout=10.0) as client:
                return (await client.decide("hello", QUESTIONS))["server"]
        assert asyncio.run(asyncio.wait_for(main(), WITHIN_S)) == "local"


def test_a_name_that_does_not_resolve_times_out_naming_the_lookup(dns_server):
    with JevClient("dns+tcp://nobody.test:5555", timeout=0.5) as client:
        with pytest.raises(TimeoutError, match="nobody.test"):
            client.ping()


@pytest.mark.parametrize("bad", ["dns+tcp://", "dns+tcp://name:port", "dns+tcp://name:0", "dns+tcp://a/b:1"])
def test_a_malformed_discovered_endpoint_is_refused_when_the_client_is_made(bad):
    with pytest.raises(ValueError, match="dns\\+tcp://NAME:PORT"):
        JevClient(bad)
