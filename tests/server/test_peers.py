"""The loop's book of connections (server/peers.py), fed libzmq's monitor events in the orders they can come.

The kernel hands a departed connection's descriptor to the next one, on any
socket of the process; a message on it must be tied to the new connection,
or its reply is dropped as if its client had gone (seen as a drain op that
got no reply, one run in about a dozen on a busy machine).
"""
import zmq

from jevany_daemon.server.peers import Peers

FD = 7


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
