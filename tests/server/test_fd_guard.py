"""Whom the descriptor guard (fds.py, peers.py) sheds near the limit: never a client holding a request,
connections that never spoke first, then idle clients longest silent first, only as many as needed; when
it takes peers again, and how soon it refuses again after; and that the control endpoint's newcomers stay.
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


def _closing(shut: list):
    """Peers.close as the guard sees it, no real descriptors: each victim marked closing, its fd recorded."""
    def close(victims):
        for conn in victims:
            conn.closing = True
            shut.append(conn.fd)
    return close


def test_while_refusing_a_newcomer_on_the_control_endpoint_is_kept_and_one_on_a_public_endpoint_turned_away():
    # The control endpoint is how its owner reaches a daemon under pressure (status, drain): only the public
    # endpoints stop taking peers, and only their newcomers are closed as libzmq reports them.
    public, control = Listener(), object()
    peers = Peers(zmq.Poller(), lambda: NOW)
    for fd in range(100, 125):
        peers.conns[fd] = Conn(fd=fd, serial=fd, since=0.0, seen=NOW - 1.0, heard=True, sock=public.sock)
    shut = []
    peers.close = _closing(shut)
    g = FdGuard(peers, [public], lambda: set(), lambda: NOW, limit=LIMIT)
    g.others = 30                                                      # 55 open: past REFUSE_AT
    g.check()
    assert g.refusing and not public.taking
    peers._event(control, {"event": zmq.EVENT_ACCEPTED, "value": 7})
    peers._event(public.sock, {"event": zmq.EVENT_ACCEPTED, "value": 8})
    assert 8 in shut and 7 not in shut and not peers.conns[7].closing
    assert peers.turned_away == 1


def test_the_endpoints_take_peers_again_once_the_floods_silent_connections_are_gone_and_not_before():
    # Under RESUME_BELOW is not enough: while a connection that never spoke still holds its descriptor (shut by
    # us, not yet reported gone by libzmq) the flood may still be knocking. A connection to the control endpoint
    # that has not spoken yet is its owner's, not the flood's: it keeps nothing closed.
    public, control = Listener(), object()
    peers = Peers(zmq.Poller(), lambda: NOW)
    flood = [Conn(fd=fd, serial=fd, since=0.0, seen=NOW - MUTE_S - 1, sock=public.sock) for fd in range(10, 30)]
    owner = Conn(fd=5, serial=5, since=NOW, seen=NOW, sock=control)      # just connected: not yet judged mute
    for conn in [*flood, owner]:
        peers.conns[conn.fd] = conn
    shut = []
    peers.close = _closing(shut)
    g = FdGuard(peers, [public], lambda: set(), lambda: NOW, limit=LIMIT)
    g.others = 30                                                      # 51 open: past REFUSE_AT
    g.check()
    assert g.refusing and not public.taking and sorted(shut) == [c.fd for c in flood]
    g.others = 10                                                      # 31 open: under RESUME_BELOW
    g.check()
    assert g.refusing and not public.taking                            # the flood's are shut, not yet gone
    for conn in flood:                                                 # libzmq reports them gone
        del peers.conns[conn.fd]
    g.check()
    assert not g.refusing and public.taking and not owner.closing
