"""Replies on their way out: to the connection that asked, and never more held for a client than it reads.

Two things a ROUTER will not do for us:

- It routes by routing id, and a client may choose its own. Once a client
  disconnects, a newcomer that connects under the same id would receive the
  replies meant for it. So a reply goes out only while the connection its
  request came on lives (peers.py); otherwise it is dropped, as a reply to a
  departed client always was.
- It bounds what it holds for a client that stops reading by count (the send
  high-water mark, 1000), not by bytes, and one reply can be megabytes (a
  choice question echoes its option names). So the bytes sent to a client
  since its socket's kernel buffer was last seen draining are counted (the
  buffer's fill is SIOCOUTQ): past SOFT_BYTES for GRACE_S, or past
  HARD_BYTES at once, further replies to it are dropped until it reads. A
  client that reads, however bursty, keeps its buffer draining and never
  meets either bound. What libzmq has queued but not yet written to the
  kernel, and what the client's own libzmq takes in, cannot be seen this
  way; the high-water mark bounds that part by count.
"""
import array
import fcntl
import logging
import termios

import zmq

from .logs import RateLimited
from .peers import UNWATCHED, Peer

log = logging.getLogger("jevany.supervisor")

DRAINING_BELOW = 64 << 10   # a kernel send queue under this is being read
SOFT_BYTES = 1 << 20        # held for a client that has not read for GRACE_S
GRACE_S = 2.0
HARD_BYTES = 32 << 20       # held for a client, however recently it read
DROPPED_LOG_EVERY_S = 10.0


class Envelope(list):
    """A request's routing frames, and the connection they came on (for the reply's checks)."""
    peer: Peer = UNWATCHED

    @classmethod
    def of(cls, frames: list, peer: Peer) -> "Envelope":
        envelope = cls(frames)
        envelope.peer = peer
        return envelope


class Outbox:
    def __init__(self, peers, clock):
        self.peers, self.clock = peers, clock
        self.held: dict = {}         # (fd, serial) → [bytes sent since it last drained, since when]
        self.dropped = RateLimited(log, "reply_dropped", DROPPED_LOG_EVERY_S, clock, level=logging.WARNING)
        self.dropped_by_cause: dict[str, int] = {}

    def send(self, sock, envelope: list, payload: bytes) -> bool:
        peer = getattr(envelope, "peer", UNWATCHED)
        if peer.serial is not None:
            self.peers.read()         # a disconnect libzmq has reported must be known before routing by id
            if not self.peers.alive(peer):
                return self._drop("client gone")
            if not self._may_hold(peer, len(payload)):
                return self._drop("client not reading")
        try:
            sock.send_multipart([*envelope, payload], zmq.NOBLOCK)
        except zmq.Again:
            # The client's pipe is full (it stopped reading): drop rather than
            # block every other client behind it.
            return self._drop("client not reading")
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            return self._drop("client gone")
        return True

    def _may_hold(self, peer: Peer, size: int) -> bool:
        key = (peer.fd, peer.serial)
        if _unread(peer.fd) < DRAINING_BELOW:
            self.held.pop(key, None)       # it reads: nothing is piling up for it
            return True
        held = self.held.setdefault(key, [0, self.clock()])
        over = held[0] + size > HARD_BYTES or (held[0] > SOFT_BYTES and self.clock() - held[1] >= GRACE_S)
        if over and held[0] > 0:           # one reply always goes, however big
            return False
        held[0] += size
        return True

    def forget_gone(self) -> None:
        """Drop the accounts of connections that went (bounded by the connections open)."""
        for key in [k for k in self.held if not self.peers.alive(Peer(k[0], k[1]))]:
            del self.held[key]

    def _drop(self, cause: str) -> bool:
        self.dropped.hit(cause=cause)
        self.dropped_by_cause[cause] = self.dropped_by_cause.get(cause, 0) + 1
        return False


def _unread(fd: int) -> int:
    """Bytes sent on fd's socket that the peer has not read yet (SIOCOUTQ); 0 when it cannot be told."""
    out = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.TIOCOUTQ, out, True)
    except OSError:
        return 0
    return out[0]
