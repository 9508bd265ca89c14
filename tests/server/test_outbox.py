"""Replies on their way out: the per-client account and the budget for all clients, with fake sockets and
connections (test_hostile_neighbours.py and test_peer_identity.py drive the same with real ones)."""
from types import SimpleNamespace

from jevany_daemon.server import outbox as outbox_module
from jevany_daemon.server.outbox import (CLOSED, DRAINING_BELOW, GRACE_S, HARD_BYTES, NOT_READING, TOTAL_BYTES, Budget,
                                         Envelope, Outbox)
from jevany_daemon.server.peers import Peer

MB = 1 << 20


class Tracker:
    done = False


class Sock:
    """Takes every message; tracked sends get a tracker libzmq never lets go of (the client reads nothing)."""

    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, flags=0, copy=True, track=False):
        self.sent.append(frames)
        return Tracker() if track else None


class Conns:
    """The connections peers.py would know: every one alive, closed when the budget says."""

    def __init__(self, *fds):
        self.conns = {fd: SimpleNamespace(serial=1, closing=False) for fd in fds}
        self.closed = []

    def read(self):
        pass

    def alive(self, peer):
        conn = self.conns.get(peer.fd)
        return conn is not None and not conn.closing

    def close(self, conns):
        for conn in conns:
            conn.closing = True
        self.closed += conns


def test_one_reply_goes_to_a_client_not_reading_however_big_and_the_next_waits(monkeypatch):
    monkeypatch.setattr(outbox_module, "_unread", lambda fd: DRAINING_BELOW)     # its kernel queue is not draining
    monkeypatch.setattr(outbox_module, "TOTAL_BYTES", 1 << 40)
    outbox, sock = Outbox(Conns(7), lambda: 0.0), Sock()
    envelope = Envelope.of([b"id"], Peer(7, 1))
    assert outbox.send(sock, envelope, b"x" * (HARD_BYTES + 1))
    assert not outbox.send(sock, envelope, b"y")
    assert outbox.dropped_by_cause == {NOT_READING: 1} and len(sock.sent) == 1


def test_a_reply_that_fills_the_total_exactly_fits():
    budget = Budget(Conns(1, 2), lambda: 0.0, {})
    budget.track((1, 1), Tracker(), TOTAL_BYTES - MB)
    assert budget.fits((2, 1), MB)
    assert not budget.fits((2, 1), MB + 1)       # nobody has gone GRACE_S unread: nothing closed to make room


def test_the_largest_stuck_holder_is_closed_first_and_no_more_than_it_takes():
    now = [0.0]
    conns, dropped = Conns(1, 2, 3), {}
    budget = Budget(conns, lambda: now[0], dropped)
    for fd, size in ((1, 20 * MB), (2, 24 * MB), (3, 20 * MB)):
        budget.track((fd, 1), Tracker(), size)
    now[0] = GRACE_S
    assert budget.fits((3, 1), 4 * MB)
    assert [c is conns.conns[2] for c in conns.closed] == [True]
    assert dropped == {CLOSED: 1} and budget.closed == 1


def test_what_a_closed_connection_held_counts_until_libzmq_lets_it_go():
    now = [0.0]
    budget = Budget(Conns(1, 2), lambda: now[0], {})
    trackers = {1: Tracker(), 2: Tracker()}
    budget.track((1, 1), trackers[1], 30 * MB)
    budget.track((2, 1), trackers[2], 34 * MB)
    now[0] = GRACE_S
    assert budget.fits((1, 1), MB)
    assert budget.describe()["replies_held_bytes"] == 64 * MB     # the closed one's still pinned in libzmq
    trackers[2].done = True
    assert budget.describe() == {"replies_held_bytes": 30 * MB, "closed_not_reading": 1}


def test_a_reply_bigger_than_the_whole_total_goes_once_nothing_else_is_held(monkeypatch):
    # A reply may pass TOTAL_BYTES by itself (a choice question echoes its option names); held to the total
    # it would never go, and its caller would wait out its timeout for nothing. With nothing else held, it goes.
    monkeypatch.setattr(outbox_module, "_unread", lambda fd: 0)                  # a client that reads
    outbox, sock = Outbox(Conns(7), lambda: 0.0), Sock()
    assert outbox.send(sock, Envelope.of([b"id"], Peer(7, 1)), b"x" * (TOTAL_BYTES + 1))
    assert len(sock.sent) == 1 and outbox.budget.total == TOTAL_BYTES + 1 and not outbox.dropped_by_cause
    # And when a stuck client holds the rest, it is closed to make room, then the big one goes.
    now = [0.0]
    conns = Conns(1, 2)
    budget = Budget(conns, lambda: now[0], {})
    budget.track((2, 1), Tracker(), MB)
    now[0] = GRACE_S
    assert budget.fits((1, 1), TOTAL_BYTES + 1) and [c is conns.conns[2] for c in conns.closed] == [True]
