"""Client messages as the loop takes them in: a time budget each turn, and each message bounded whole.

ZeroMQ's ZMQ_MAXMSGSIZE bounds each frame, not a message: ten frames of
7.9 MB and a payload pass it, and a ROUTER reply echoes every frame before
the payload, so a client that never reads could pin gigabytes. Here a message
is taken only when its routing frames are routing frames: at most
MAX_ENVELOPE_FRAMES of them (a DEALER's message has one, the ROUTER's id; a
REQ's two; each proxy on the way adds one), each at most 255 bytes (ZMTP's
bound on a routing id). Anything else is dropped unread and uncounted as a
request, as ZeroMQ drops a frame over its limit: there is no envelope worth
a reply.

Messages are taken round-robin from every client socket until
RECEIVE_BUDGET_S has passed, and the loop goes on with its other phases;
what is left waits for the next turn. A turn is bounded by time, not by a
count of messages whose cost the sender chooses, so no burst makes the loop
judge a worker's heartbeat or a deadline late.
"""
import zmq

from jevany_client.calls import has_message

from jevany_daemon import tenants

from .outbox import Envelope
from .peers import UNWATCHED, Peer, identify

RECEIVE_BUDGET_S = 0.02
MAX_ENVELOPE_FRAMES = 16
MAX_ROUTING_FRAME = 255


class Inbox:
    def __init__(self, peers, clock, gateway_sock=None):
        self.peers, self.clock, self.gateway_sock = peers, clock, gateway_sock
        self.watched: set = set()       # the sockets whose peers peers.py follows
        self.refused = 0                # messages dropped for their envelope

    def take(self, socks: list, handle) -> None:
        """Call handle(sock, envelope, payload) for each message taken this turn."""
        deadline = self.clock() + RECEIVE_BUDGET_S
        live = list(socks)
        while live:
            self.peers.read()       # connections reported meanwhile: the descriptor guard hears of them now
            for sock in list(live):
                frames = _next(sock)
                if frames is None:
                    live.remove(sock)
                    continue
                if len(frames) < 2 or not _is_envelope(frames[:-1]):
                    self.refused += 1
                    continue
                envelope = [f.bytes for f in frames[:-1]]
                handle(sock, Envelope.of(envelope, self._peer(sock, frames, envelope)), frames[-1].bytes)
            if self.clock() >= deadline:
                return

    def _peer(self, sock, frames: list, envelope: list) -> Peer:
        if sock in self.watched:
            return self.peers.came_from(frames[-1], identify)
        if sock is self.gateway_sock:
            return Peer(None, None, tenant=tenants.from_gateway(envelope))
        return UNWATCHED


def _next(sock) -> list | None:
    if not has_message(sock):
        return None
    try:
        return sock.recv_multipart(zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return None


def _is_envelope(frames: list) -> bool:
    return len(frames) <= MAX_ENVELOPE_FRAMES and all(len(f) <= MAX_ROUTING_FRAME for f in frames)
