"""Hostile clients that cost everyone else: replies nobody reads.

Replies held for clients that do not read are bounded for all clients together (outbox.py, Budget),
the one holding the most closed first. Real processes and sockets, loopback and ipc only; a client
that must not read at all is a process stopped with SIGSTOP.
"""
import multiprocessing as mp
import os
import signal
from pathlib import Path

import zmq

from jevany_daemon.server.outbox import CLOSED, GONE, GRACE_S, OVER_TOTAL, TOTAL_BYTES, Envelope, Outbox
from jevany_daemon.server.peers import Peers

from .daemons import wait_for

MB = 1 << 20


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
