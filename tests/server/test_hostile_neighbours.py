"""Hostile clients that cost everyone else: replies nobody reads, and a flood of idle connections.

Replies held for clients that do not read are bounded for all clients together (outbox.py, Budget),
the one holding the most closed first; the supervisor's memory follows. A newcomer is served as soon
as a flood of idle connections is over, not after a cool-down (fds.py). Real processes and sockets,
loopback and ipc only; a client that must not read at all is a process stopped with SIGSTOP.
"""
import multiprocessing as mp
import os
import signal
import tempfile
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from jevany_client import JevClient
from jevany_daemon.server.outbox import CLOSED, GONE, GRACE_S, OVER_TOTAL, TOTAL_BYTES, Envelope, Outbox
from jevany_daemon.server.peers import Peers

from .daemons import rss_kb, wait_for
from .shared_daemons import Raw, frozen, running_daemon, serving_worker
from .test_hostile_clients import _as_another_user, _flood, _limit_descriptors

MB = 1 << 20
KEY_BYTES = 140_000     # 52 option keys of this size: a 7.3 MB request whose answer echoes them (7.4 MB)


@pytest.fixture(scope="module")
def daemon(tiny_model):
    directory = Path(tempfile.mkdtemp(prefix="jvd-"))
    directory.chmod(0o755)            # another local user may reach the public socket (mode 0666)
    with running_daemon(tiny_model("qwen3", "choice"), "--socket-mode", "0666", preexec=_limit_descriptors,
                        directory=directory) as d:
        yield d


def _big(tag: str) -> dict:
    # The choice readout shows the model each option's description, not its key: the keys cost
    # no tokens, and come back in the answer's probabilities.
    criteria = {f"{tag}-{j}-" + "k" * KEY_BYTES: "o" for j in range(52)}
    return {"state": "s", "questions": {"q": {"type": "choice", "criteria": criteria}}}


def _control(daemon) -> dict:
    with daemon.control_client(timeout=30) as control:
        return control.status()


def _mode(endpoint: str) -> int:
    return os.stat(endpoint.removeprefix("ipc://")).st_mode & 0o777


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _nobody(frame):
    return None, None


def _connect_and_wait(endpoint: str, ids: list, ready, done) -> None:
    """In a child: one DEALER per id, each says hello, then nothing more (the test stops this process)."""
    ctx = zmq.Context()
    socks = []
    for routing_id in ids:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send(b"hello")
        socks.append(sock)
    ready.set()
    done.wait(60)
    ctx.destroy(linger=0)


def test_replies_held_for_all_clients_are_bounded_and_the_largest_holder_is_closed_first(tmp_path):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    endpoint = f"ipc://{tmp_path}/r.sock"
    router.bind(endpoint)
    clock = Clock()
    peers = Peers(zmq.Poller(), clock)
    peers.watch(router)
    outbox = Outbox(peers, clock)
    forked = mp.get_context("fork")
    ready, done = forked.Event(), forked.Event()
    holders = forked.Process(target=_connect_and_wait, args=(endpoint, [b"a", b"b", b"c"], ready, done), daemon=True)
    holders.start()
    try:
        assert ready.wait(30)
        envelopes = {}
        while len(envelopes) < 3:
            assert router.poll(30_000), "a holder's hello never came"
            frames = router.recv_multipart(copy=False)
            peers.read()
            envelopes[frames[0].bytes] = Envelope.of([frames[0].bytes], peers.came_from(frames[-1], _nobody))
        reply = 4 * MB
        os.kill(holders.pid, signal.SIGSTOP)       # reads nothing from now on, not even into its own libzmq
        wait_for(lambda: _stopped(holders.pid), 10, "the holders stopped")
        # 24, 20 and 20 MiB: each within its own bounds, all of it held here (the tracker of a reply the
        # kernel has taken a part of is not done either).
        for name, n in ((b"a", 6), (b"b", 5), (b"c", 5)):
            for i in range(n):
                assert outbox.send(router, envelopes[name], bytes([i]) * reply), (name, i)
        assert outbox.budget.total == 64 * MB == TOTAL_BYTES
        # One more passes the total, and nobody has gone GRACE_S without reading: refused.
        assert not outbox.send(router, envelopes[b"b"], b"x" * reply)
        assert outbox.dropped_by_cause == {OVER_TOTAL: 1}
        # Once they have not read for GRACE_S, a reply to a client that reads closes the largest holder, and
        # only as many as it takes.
        clock.now += GRACE_S
        reader = ctx.socket(zmq.DEALER)
        reader.setsockopt(zmq.LINGER, 0)
        reader.connect(endpoint)
        reader.send(b"hello")
        assert router.poll(30_000)
        frames = router.recv_multipart(copy=False)
        peers.read()
        to_reader = Envelope.of([frames[0].bytes], peers.came_from(frames[-1], _nobody))
        assert outbox.send(router, to_reader, b"r" * reply)
        assert reader.poll(30_000) and len(reader.recv()) == reply
        alive = {name: peers.alive(e.peer) for name, e in envelopes.items()}
        assert alive == {b"a": False, b"b": True, b"c": True}
        assert outbox.dropped_by_cause == {OVER_TOTAL: 1, CLOSED: 6}
        assert outbox.budget.closed == 1
        assert not outbox.send(router, envelopes[b"a"], b"late")
        assert outbox.dropped_by_cause[GONE] == 1
        # What it held is let go of as its connection ends (the ROUTER takes libzmq's word as it is used),
        # and the reader's reply once written: the two stopped holders' 40 MiB are all that is left.
        def let_go() -> bool:
            router.getsockopt(zmq.EVENTS)
            peers.read()
            outbox.budget.settle()
            return not outbox.budget.letting_go and outbox.budget.total == 40 * MB

        wait_for(let_go, 10, "the closed holder's replies and the reader's let go")
    finally:
        os.kill(holders.pid, signal.SIGCONT)
        done.set()
        holders.join(10)
        ctx.destroy(linger=0)


def _stopped(pid: int) -> bool:
    """Whether every thread of pid has stopped (SIGSTOP is delivered to each as it next runs)."""
    tasks = Path(f"/proc/{pid}/task")
    return all((task / "stat").read_text().rsplit(")", 1)[1].split()[0] in "tT" for task in tasks.iterdir())


def _ask_and_wait(endpoint: str, requests: list, clients: int, ready, done) -> None:
    """In a child: clients DEALERs, each sending every request, then reading nothing."""
    ctx = zmq.Context()
    socks = []
    for _ in range(clients):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        socks.append(sock)
    for sock in socks:
        for request in requests:
            sock.send(request)
    ready.set()
    done.wait(120)
    ctx.destroy(linger=0)


def test_clients_that_never_read_their_big_replies_cost_the_supervisor_a_bounded_total(daemon):
    # Ten clients x two replies of 7.4 MB, none read: each client within its own bounds, 148 MB in all.
    # Now at most TOTAL_BYTES is held for all of them together, and what is let go of goes back to the
    # system.
    clients, each = 10, 2
    pid = daemon.proc.pid
    with Raw(daemon.endpoint) as warm:            # the supervisor's first big reply: its baseline
        warm.send("warm", "decide", _big("warm"))
        assert warm.recv(60)["ok"]
    before = rss_kb(pid)
    decided = _control(daemon)["requests"]["by_op"].get("decide", 0)
    requests = [msgpack.packb({"v": 1, "id": i, "op": "decide", "body": _big(f"r{i}")}) for i in range(each)]
    forked = mp.get_context("fork")
    ready, done = forked.Event(), forked.Event()
    worker = serving_worker(daemon)
    hogs = forked.Process(target=_ask_and_wait, args=(daemon.endpoint, requests, clients, ready, done), daemon=True)
    try:
        with frozen(worker["pid"]):          # every request at the supervisor before a reply leaves it
            hogs.start()
            assert ready.wait(60)

            def all_taken_in() -> bool:
                status = _control(daemon)
                return status["queue"]["depth"] + serving_worker(daemon)["inflight"] == clients * each

            wait_for(all_taken_in, 60, "every request taken in")
            os.kill(hogs.pid, signal.SIGSTOP)
            wait_for(lambda: _stopped(hogs.pid), 10, "the clients stopped")
        wait_for(lambda: _control(daemon)["requests"]["by_op"].get("decide", 0) >= decided + clients * each, 120,
                 "every request answered")
        grew = rss_kb(pid) - before
        status = _control(daemon)["clients"]
        print(f"{clients} x {each} unread replies of 7.4 MB: supervisor RSS {before // 1024} MB -> "
              f"+{grew // 1024} MB; {status}")
        assert grew < 100 * 1024, f"the supervisor grew {grew // 1024} MB"
        assert status["replies_held_bytes"] <= TOTAL_BYTES
        assert status["replies_dropped"].get(OVER_TOTAL, 0) + status["replies_dropped"].get(CLOSED, 0) > 0
        with daemon.client(timeout=30) as client:       # and everybody else is served as before
            assert client.ping()["pong"]
    finally:
        if hogs.pid is not None:
            os.kill(hogs.pid, signal.SIGCONT)
        done.set()
        hogs.join(30)


def test_a_newcomer_is_served_as_soon_as_a_flood_of_idle_connections_is_over(daemon):
    # 1,100 idle connections from another user against a 1,024-descriptor limit, that come back each time
    # they are closed. The endpoint is stopped and resumed as the flood is shed and comes back; when it
    # ends, right after a refusal began, a newcomer is served at once. It waited out a cool-down before,
    # doubled each time the flood came back: about 8 s by the fourth refusal.
    # Meanwhile the control endpoint, its owner's way in, keeps its mode: only the public one is closed.
    flooder, done = _as_another_user(_flood, daemon.endpoint, 1100)
    try:
        seen, modes = [], []

        def refused_again() -> bool:
            clients = _control(daemon)["clients"]
            seen.append(clients)
            if clients["refusing_new_peers"]:
                modes.append((_mode(daemon.endpoint), _mode(daemon.control)))
            return clients["refusals"] >= 4 and clients["refusing_new_peers"]

        wait_for(refused_again, 60, "the flood refused a fourth time")
        assert daemon.proc.poll() is None and max(c["open"] for c in seen) < 1024 * 0.75
        assert (0, 0o600) in modes and {control for _, control in modes} == {0o600}, modes
    finally:
        done.set()
        flooder.join(30)
    ended = time.monotonic()
    with JevClient(daemon.endpoint, timeout=30) as newcomer:
        assert newcomer.ping()["pong"]
    waited = time.monotonic() - ended
    print(f"a newcomer waited {waited:.2f}s after the flood; {seen[-1]}")
    assert waited < 3.0, f"a newcomer waited {waited:.1f}s after the flood ended"
