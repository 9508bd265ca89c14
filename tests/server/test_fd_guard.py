"""Whom the descriptor guard (fds.py, peers.py) sheds near the limit: never a client holding a request,
connections that never spoke first, then idle clients longest silent first, only as many as needed.
No sockets: Peers with connections put in by hand, an injected clock, the shutdowns recorded."""
import zmq

from jevany_daemon.server.fds import MUTE_S, QUIET_S, RESUME_BELOW, FdGuard
from jevany_daemon.server.peers import Conn, Peers

NOW = 1000.0
LIMIT = 100


def guard(conns: list[Conn], others: int, busy=frozenset()):
    peers = Peers(zmq.Poller(), lambda: NOW)
    for conn in conns:
        peers.conns[conn.fd] = conn
    shut = []
    peers.close = lambda victims: shut.extend(c.fd for c in victims)      # no real descriptors here
    g = FdGuard(peers, [], lambda: set(busy), lambda: NOW, limit=LIMIT)
    g.others = others                                                      # not this process's real count
    return g, shut


def client(fd: int, silent_s: float, heard: bool = True) -> Conn:
    return Conn(fd=fd, serial=fd, since=0.0, seen=NOW - silent_s, heard=heard)


def test_idle_clients_are_shed_longest_silent_first_and_only_as_many_as_needed():
    quiet = [client(fd, QUIET_S + fd) for fd in range(100, 120)]      # fd 119 the longest silent
    recent = [client(fd, 1.0) for fd in range(200, 205)]              # spoke a second ago
    g, shut = guard(quiet + recent, others=30)                        # 55 open: past REFUSE_AT
    g.check()
    assert g.refusing
    excess = 55 - int(RESUME_BELOW * LIMIT) + 1
    assert shut == list(range(119, 119 - excess, -1))                 # the 16 longest silent, in that order
    assert not set(shut) & {c.fd for c in recent}


def test_a_silent_client_holding_a_request_is_never_shed():
    holding = client(50, QUIET_S * 100)                               # the longest silent of all, but waiting
    mute_holding = client(51, MUTE_S * 100, heard=False)              # never spoke here, yet holds one
    quiet = [client(fd, QUIET_S + fd) for fd in range(100, 120)]
    g, shut = guard([holding, mute_holding] + quiet, others=30, busy={50, 51})
    g.check()
    assert g.refusing and 50 not in shut and 51 not in shut
    assert shut[0] == 119


def test_connections_that_never_spoke_go_first_then_the_quietest_clients_fill_the_rest():
    mute = [client(fd, MUTE_S + 0.5, heard=False) for fd in range(10, 14)]
    fresh = client(20, MUTE_S / 2, heard=False)                       # just connected: not yet judged mute
    quiet = [client(fd, QUIET_S + fd) for fd in range(100, 120)]
    g, shut = guard(mute + [fresh] + quiet, others=30)                # 55 open: 16 to shed
    g.check()
    assert shut[:4] == [10, 11, 12, 13] and 20 not in shut
    assert shut[4:] == list(range(119, 107, -1))                      # 12 more, not 16 more
