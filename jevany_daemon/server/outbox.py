"""Replies on their way out: to the connection that asked, and never more held than clients read.

Three things a ROUTER will not do for us:

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
- It bounds each client, never their sum: clients that never read, each
  held up to its own bound, pin memory in proportion to their number. So
  every reply libzmq may hold for long (TRACK_FROM bytes or more, or any
  reply to a client whose buffer is not draining) is sent zero-copy and
  tracked until libzmq lets its bytes go (pyzmq's MessageTracker), and
  those held for all clients together stay within TOTAL_BYTES (Budget).
"""
import array
import fcntl
import logging
import termios
from collections import deque

import zmq

from jevany_daemon.logs import RateLimited

from .peers import UNWATCHED, Peer

log = logging.getLogger("jevany.supervisor")

DRAINING_BELOW = 64 << 10   # a kernel send queue under this is being read
SOFT_BYTES = 1 << 20        # held for a client that has not read for GRACE_S
GRACE_S = 2.0
HARD_BYTES = 32 << 20       # held for a client, however recently it read
TOTAL_BYTES = 64 << 20      # held for all clients together (Budget)
TRACK_FROM = 64 << 10       # a reply this big is tracked wherever it goes (smaller ones: pyzmq copies them)
DROPPED_LOG_EVERY_S = 10.0

GONE, NOT_READING = "client gone", "client not reading"
OVER_TOTAL = "held replies past the total"     # refused: the total is held, none of it GRACE_S unread
CLOSED = "client closed for not reading"       # held for a client the budget disconnected, lost with it


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
        self.budget = Budget(peers, clock, self.dropped_by_cause)

    def send(self, sock, envelope: list, payload: bytes) -> bool:
        peer = getattr(envelope, "peer", UNWATCHED)
        key = tracked = None
        if peer.serial is not None:
            self.peers.read()         # a disconnect libzmq has reported must be known before routing by id
            if not self.peers.alive(peer):
                return self._drop(GONE)
            unread = _unread(peer.fd)
            if not self._may_hold(peer, unread, len(payload)):
                return self._drop(NOT_READING)
            key = (peer.fd, peer.serial)
            tracked = len(payload) >= TRACK_FROM or unread >= DRAINING_BELOW
            if tracked and not self.budget.fits(key, len(payload)):
                return self._drop(OVER_TOTAL if self.peers.alive(peer) else CLOSED)   # closed to make room
        try:
            if tracked:
                frame = zmq.Frame(payload, track=True, copy=False)    # its tracker: when libzmq lets go
                sent = sock.send_multipart([*envelope, frame], zmq.NOBLOCK, copy=False, track=True)
                self.budget.track(key, sent, len(payload))
            else:
                sock.send_multipart([*envelope, payload], zmq.NOBLOCK)
        except zmq.Again:
            # The client's pipe is full (it stopped reading): drop rather than
            # block every other client behind it.
            return self._drop(NOT_READING)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            return self._drop(GONE)
        return True

    def _may_hold(self, peer: Peer, unread: int, size: int) -> bool:
        key = (peer.fd, peer.serial)
        if unread < DRAINING_BELOW:
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
        self.budget.settle()

    def _drop(self, cause: str) -> bool:
        self.dropped.hit(cause=cause)
        self.dropped_by_cause[cause] = self.dropped_by_cause.get(cause, 0) + 1
        return False


class Budget:
    """Tracked replies that libzmq still holds, per connection, and their total within TOTAL_BYTES.

    Refusing a reply frees nothing already queued: libzmq lets a
    connection's queue go only when the connection ends (at once, as the
    loop next uses the socket; not after its linger, the peer being gone).
    So when a reply would pass the total, the connections whose oldest reply
    still held was sent GRACE_S ago are closed, the one holding the most
    first, until it fits (peers.py shuts the connection down; its client's
    ZeroMQ socket connects again by itself, and the replies it had not read
    are lost). If it still does not fit, the reply is dropped: what fills
    the total then was sent less than GRACE_S ago, to clients that may yet
    read it. Nothing held at all, one reply goes however big. A client that
    reads takes each reply within milliseconds, so it is never closed.
    """

    def __init__(self, peers, clock, dropped_by_cause: dict):
        self.peers, self.clock, self.dropped_by_cause = peers, clock, dropped_by_cause
        self.replies: dict[tuple, deque] = {}   # (fd, serial) → deque of [tracker, size, sent at], oldest first
        self.bytes: dict[tuple, int] = {}       # (fd, serial) → what its replies hold
        self.total = 0
        self.letting_go: list = []              # the replies of closed connections, until libzmq lets go
        self.closed = 0
        self.closing = RateLimited(log, "client_closed", DROPPED_LOG_EVERY_S, clock, level=logging.WARNING)

    def track(self, key: tuple, tracker, size: int) -> None:
        self.replies.setdefault(key, deque()).append([tracker, size, self.clock()])
        self.bytes[key] = self.bytes.get(key, 0) + size
        self.total += size

    def fits(self, key: tuple, size: int) -> bool:
        """Whether a reply of size may go to key, after closing stuck holders, largest first, to make room."""
        self.settle()
        if self.total + size <= TOTAL_BYTES:
            return True
        now = self.clock()
        for holder in sorted(self.bytes, key=self.bytes.__getitem__, reverse=True):
            if self.total + size <= TOTAL_BYTES:
                break
            if now - self.replies[holder][0][2] >= GRACE_S:
                self._close(holder)
                if holder == key:
                    return False       # the one it was for: gone with the rest
        return self.total == 0 or self.total + size <= TOTAL_BYTES

    def settle(self) -> None:
        """Forget what libzmq has let go of: written to the kernel, or dropped with its connection."""
        for key in list(self.replies):
            replies = self.replies[key]
            while replies and replies[0][0].done:     # a connection's replies leave in order
                self.bytes[key] -= replies[0][1]
                self.total -= replies.popleft()[1]
            if not replies:
                del self.replies[key], self.bytes[key]
        self.letting_go = [reply for reply in self.letting_go if not reply[0].done]
        self.closing.flush()

    def _close(self, key: tuple) -> None:
        replies, held = self.replies.pop(key), self.bytes.pop(key)
        self.total -= held
        self.letting_go.extend(replies)
        conn = self.peers.conns.get(key[0])
        if conn is None or conn.serial != key[1] or conn.closing:
            return                 # going already: libzmq lets go of its queue as it goes
        self.peers.close([conn])
        self.closed += 1
        self.dropped_by_cause[CLOSED] = self.dropped_by_cause.get(CLOSED, 0) + len(replies)
        self.closing.hit(cause="not reading", held_bytes=held, replies=len(replies), total_bytes=self.total)

    def describe(self) -> dict:
        self.settle()
        return {"replies_held_bytes": self.total + sum(size for _, size, *_ in self.letting_go),
                "closed_not_reading": self.closed}


def _unread(fd: int) -> int:
    """Bytes sent on fd's socket that the peer has not read yet (SIOCOUTQ); 0 when it cannot be told."""
    out = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.TIOCOUTQ, out, True)
    except OSError:
        return 0
    return out[0]
