"""The loop's book of connections (server/peers.py), fed libzmq's monitor events in the orders they can come.

The kernel hands a departed connection's descriptor to the next one, on any
socket of the process; a message on it must be tied to the new connection,
or its reply is dropped as if its client had gone (seen as a drain op that
got no reply, one run in about a dozen on a busy machine); and a departed
connection's last message, read after a newcomer took its descriptor, must
not be taken for the newcomer's.
"""
import zmq

from jevany_daemon.server.peers import Peer, Peers, is_trusted_uid

FD = 9999       # no descriptor of this process: who holds it cannot be told, so nothing is judged by it


class Fed(Peers):
    """Peers whose monitor events are handed in by the test: read() takes those given so far."""

    def __init__(self):
        super().__init__(zmq.Poller(), lambda: 1000.0)
        self.waiting: list = []

    def happen(self, sock, event: int, fd: int = FD) -> None:
        self.waiting.append((sock, {"event": event, "value": fd, "endpoint": b""}))

    def read(self) -> None:
        while self.waiting:
            self._event(*self.waiting.pop(0))


class Frame:
    def get(self, key):
        assert key == zmq.SRCFD
        return FD


def nobody(frame):
    return None, None


def test_a_message_on_a_reused_descriptor_belongs_to_the_new_connection_and_its_reply_goes():
    main, control = object(), object()
    peers = Fed()
    peers.happen(main, zmq.EVENT_ACCEPTED)
    peers.read()
    first = peers.came_from(Frame(), nobody)        # a status call on the main socket
    # It leaves, and a control client gets its descriptor and sends, all after the loop last read events.
    peers.happen(main, zmq.EVENT_DISCONNECTED)
    peers.happen(control, zmq.EVENT_ACCEPTED)
    second = peers.came_from(Frame(), nobody)
    assert second.serial != first.serial
    peers.read()                                     # as the outbox does before each reply
    assert peers.alive(second) and not peers.alive(first)
    assert peers.describe() == {"connected": 1, "accepted": 2, "gone": 1, "closed_idle": 0,
                                     "turned_away": 0}


def test_a_connection_gone_from_one_socket_never_takes_another_sockets_connection_with_it():
    main, control = object(), object()
    peers = Fed()
    peers.happen(control, zmq.EVENT_ACCEPTED)
    peers.read()
    # The main socket's monitor is read first: its new connection's accept comes before the
    # departure of the control connection that held the descriptor.
    peers.happen(main, zmq.EVENT_ACCEPTED)
    peers.happen(control, zmq.EVENT_DISCONNECTED)
    peers.read()
    [conn] = peers.conns.values()
    assert conn.sock is main
    assert peers.describe()["connected"] == 1 and peers.describe()["gone"] == 1
    peers.happen(main, zmq.EVENT_DISCONNECTED)
    peers.read()
    assert len(peers) == 0 and peers.describe()["gone"] == 2


def test_a_departed_connections_last_message_read_after_a_newcomer_took_its_descriptor_is_not_the_newcomers(
        tmp_path):
    # On real sockets: a message still in a departed connection's pipe names its sender (libzmq's
    # Peer-Address, per message); a newcomer in another process on the same descriptor must not be
    # taken for it, or the reply would go to whoever holds the routing id now.
    import gc
    import os
    import subprocess
    import sys

    from tests.server.daemons import wait_for

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    endpoint = f"ipc://{tmp_path}/r.sock"
    router.bind(endpoint)
    peers = Peers(zmq.Poller(), lambda: 1000.0)
    peers.watch(router)
    # The newcomer starts now and connects when told: spawning it opens and closes pipes, and
    # the collector could close a leaked file of an earlier test, either of which would free a
    # lower descriptor than the departed one between the holding below and the accept.
    newcomer = subprocess.Popen([sys.executable, "-c", "import sys, zmq; sys.stdin.readline(); "
                                 "s = zmq.Context().socket(zmq.DEALER); "
                                 f"s.connect({endpoint!r}); s.send(b'first'); sys.stdin.read()"],
                                stdin=subprocess.PIPE)
    held = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        departing = ctx.socket(zmq.DEALER)
        departing.connect(endpoint)
        departing.send(b"last words")
        wait_for(lambda: router.getsockopt(zmq.EVENTS) & zmq.POLLIN, 30, "the message reaching the router")
        peers.read()
        [fd] = peers.conns
        departing.close(linger=0)

        def closed() -> bool:
            peers.read()
            try:
                os.fstat(fd)
            except OSError:
                return not peers.conns
            return False

        wait_for(closed, 30, "the departed connection's descriptor closed")
        while (spare := os.open(os.devnull, os.O_RDONLY)) < fd:
            held.append(spare)        # every free descriptor below it, so the next accept gets the departed one
        os.close(spare)
        newcomer.stdin.write(b"connect\n")
        newcomer.stdin.flush()

        def accepted():
            peers.read()
            return list(peers.conns.values())

        [conn] = wait_for(accepted, 30, "the newcomer's connection")
        assert conn.fd == fd, "the kernel gives the lowest free descriptor: the departed one's"
        got = {}
        for _ in range(2):      # in whichever order the router's fair queue hands them over
            frame = router.recv_multipart(copy=False)[-1]
            got[frame.bytes] = peers.came_from(frame, nobody)
        assert got[b"last words"].serial != conn.serial and not peers.alive(got[b"last words"])
        assert got[b"first"].serial == conn.serial and peers.alive(got[b"first"])
    finally:
        if collecting:
            gc.enable()
        for spare in held:
            os.close(spare)
        newcomer.kill()
        newcomer.wait(10)
        peers.close_monitors()
        ctx.destroy(linger=0)


def test_a_connection_we_are_closing_is_no_longer_one_to_reply_to():
    import socket

    peers = Fed()
    mine, theirs = socket.socketpair()
    try:
        peers.happen("public", zmq.EVENT_ACCEPTED, fd=mine.fileno())
        peers.read()
        [conn] = peers.conns.values()
        peer = Peer(conn.fd, conn.serial)
        assert peers.alive(peer)
        peers.shed([conn])                   # shut down, not closed: libzmq reports it gone later
        assert not peers.alive(peer) and theirs.recv(1) == b"" and peers.describe()["closed_idle"] == 1
    finally:
        mine.close()
        theirs.close()


def test_control_ops_are_for_this_processs_user_and_root_only(monkeypatch):
    import os

    # A daemon run by a user of its own, even where the tests run as root: root must count apart from it.
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    assert is_trusted_uid(1000) and is_trusted_uid(0)
    assert not is_trusted_uid(1001) and not is_trusted_uid(None)


def test_a_message_from_a_connection_already_gone_when_it_is_read_is_the_departed_ones():
    # A client that sends and closes at once: its accept and departure are both read as its message is.
    main = object()
    peers = Fed()
    peers.happen(main, zmq.EVENT_ACCEPTED)
    peers.happen(main, zmq.EVENT_DISCONNECTED)
    gone = peers.came_from(Frame(), nobody)
    assert not peers.alive(gone)            # dropped unscored if queued, never replied to
    # The next connection on the descriptor is a live one again, and so is a descriptor never reported.
    peers.happen(main, zmq.EVENT_ACCEPTED)
    assert peers.alive(peers.came_from(Frame(), nobody))
    fresh = Fed()
    assert fresh.alive(fresh.came_from(Frame(), nobody))
