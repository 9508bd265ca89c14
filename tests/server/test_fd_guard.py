"""Whom the descriptor guard (fds.py, peers.py) sheds near the limit: never a client holding a request,
connections that never spoke first, then idle clients longest silent first, only as many as needed; and
how soon it refuses again once it took peers again.
No sockets: Peers with connections put in by hand, an injected clock, the shutdowns recorded."""
import zmq

from jevany_daemon.server.fds import AGAIN_AFTER, MUTE_S, QUIET_S, REFUSE_AT, RESUME_BELOW, FdGuard
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


class Listener:
    """A public endpoint as the guard sees it: its socket, and whether it takes peers."""
    def __init__(self):
        self.sock, self.taking = object(), True

    def stop(self):
        self.taking = False

    def resume(self):
        self.taking = True


def test_after_resuming_a_returning_flood_is_refused_after_a_few_more_not_at_refuse_at():
    # A flood that was kept out comes straight back once the endpoints take peers again: meeting it only at
    # REFUSE_AT would let it take back the whole margin each time, not AGAIN_AFTER of the limit.
    listener = Listener()
    peers = Peers(zmq.Poller(), lambda: NOW)
    for fd in range(100, 125):
        peers.conns[fd] = Conn(fd=fd, serial=fd, since=0.0, seen=NOW - QUIET_S - fd, heard=True, sock=listener.sock)
    shut = []
    peers.close = lambda victims: shut.extend(c.fd for c in victims)
    g = FdGuard(peers, [listener], lambda: set(), lambda: NOW, limit=LIMIT)
    g.others = 30                                                      # 55 open: past REFUSE_AT
    g.check()
    assert g.refusing and not listener.taking and shut
    for fd in shut:                                                    # libzmq reports the shed ones gone
        del peers.conns[fd]
    g.check()
    assert not g.refusing and listener.taking
    resumed = g.open                                                   # under RESUME_BELOW
    again = resumed + max(1, int(AGAIN_AFTER * LIMIT))
    assert again < int(REFUSE_AT * LIMIT)
    for fd in range(300, 300 + again - resumed - 1):
        peers.conns[fd] = Conn(fd=fd, serial=fd, since=NOW, seen=NOW, sock=listener.sock)
        assert not g.accepted(listener.sock)
    peers.conns[999] = Conn(fd=999, serial=999, since=NOW, seen=NOW, sock=listener.sock)
    assert g.accepted(listener.sock)                                   # the one that reaches it is turned away
    assert g.refusing and not listener.taking and g.refusals == 2
