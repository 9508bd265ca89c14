"""The daemons a client routes over: one Peer per endpoint, and who is in the pool now.

Each peer is one daemon behind its own socket (the client owns the socket;
this module only keeps the facts a policy weighs). A peer leaves the pool at
once when its connection drops or it answers `shutting_down`, and comes back
when a new connection to it is made (the daemon restarted); one that
discovery no longer lists takes no new requests and is closed once it has
answered the ones it holds. With every peer out, the draining ones are still
used: their `shutting_down` is an answer the caller's retries can act on,
where waiting for nobody would only end in a timeout.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from . import discovery
from .errors import ShuttingDownError
from .calls import has_message, read_reply
from .routing import REPORT_HALF_LIFE_S, check_routing, make_policy

RESOLVE_EVERY_S = 5.0
# A daemon's first connection (made and greeted: its ZMTP handshake done) is waited for this long before
# its requests go elsewhere: a new client would otherwise hand an affinity key to whichever daemon
# happened to connect first.
CONNECT_GRACE_S = 0.5


@dataclass(eq=False)
class Peer:
    endpoint: str
    key: str                         # its name on the affinity ring
    socket: Any = None
    monitor: Any = None
    pending: set = field(default_factory=set)     # ids of this client's requests it holds
    others: int = 0                  # the rest of its load (other clients' work), as last reported
    reported_at: float = float("-inf")
    dropped: bool = False            # its connection dropped; back when a new one is made
    draining: bool = False           # it answered shutting_down; back on a new connection
    retiring: bool = False           # discovery no longer lists it
    sent: int = 0                    # requests sent to it, for whoever wants the shares
    opened_at: float = 0.0
    ever_connected: bool = False

    def load(self, now: float) -> float:
        # A slow daemon replies seldom, so its last report is old: it fades rather than vanishes
        # (a cut-off made exactly the slowest daemons look idle), and a report that will not be
        # renewed (nothing is sent there) fades until the daemon is tried again.
        fading = 0.5 ** (max(0.0, now - self.reported_at) / REPORT_HALF_LIFE_S)
        return len(self.pending) + self.others * fading

    def note_load(self, load: Any, now: float) -> None:
        """A reply's `load` (queue and inflight at the daemon): what is not ours is the others'."""
        if not isinstance(load, dict):
            return
        queue, inflight = load.get("queue"), load.get("inflight")
        if not all(type(v) is int and v >= 0 for v in (queue, inflight)):
            return      # a field this client does not understand is ignored, never an error
        self.others = max(0, queue + inflight - len(self.pending))
        self.reported_at = now

    def replies(self, clock: Callable[[], float]):
        """Each reply waiting on its socket, as (id, outcome), for the caller to settle; then its load is
        noted, and a shutting_down takes this daemon out of the pool (the retry goes elsewhere)."""
        while has_message(self.socket):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            rid, outcome, load = read_reply(frames[-1])
            yield rid, outcome
            self.note_load(load, clock())
            if isinstance(outcome, ShuttingDownError):
                self.draining = True

    def connected(self) -> None:
        self.dropped = self.draining = False
        self.ever_connected = True

    def warming(self, now: float) -> bool:
        """Its first connection is still being made, and worth waiting for a moment."""
        return not (self.ever_connected or self.dropped) and now - self.opened_at < CONNECT_GRACE_S

    def close_sockets(self) -> None:
        if self.socket is None:
            return      # its socket was never opened
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)

    @property
    def usable(self) -> bool:
        return not (self.dropped or self.draining or self.retiring)


class Fleet:
    """The peers of one client: its static endpoints, and those its dns+tcp:// names stand for now.

    lookup() may block on DNS (the asyncio client runs it in a thread); apply() and
    the rest only touch this object, from the client's own thread or loop.
    """

    def __init__(self, endpoints: Sequence[str], routing: str | None, resolve_every: float = RESOLVE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.named = [discovery.parse(e) for e in endpoints if discovery.is_discovered(e)]
        self.static = [e for e in endpoints if not discovery.is_discovered(e)]
        self.routing = check_routing(routing, several=len(endpoints) > 1 or bool(self.named))
        self.policy = make_policy(self.routing)
        self.resolve_every = resolve_every
        self.clock = clock
        self.peers: dict[str, Peer] = {}
        self.problem: str | None = None            # the last lookup that failed, for a timeout's message
        self._found: dict[str, set[str]] = {}      # each name's last good answer
        self._resolved_at: float | None = None

    def refresh(self) -> tuple[list[Peer], list[Peer]]:
        """Look up again when due, then (peers to open, peers to close)."""
        if self._resolved_at is None or self.refresh_in() == 0:
            return self.apply(self.lookup())
        return self.apply(None)

    def refresh_in(self) -> float | None:
        """Seconds until the names are due to be looked up again; None with no names."""
        if not self.named:
            return None
        if self._resolved_at is None:
            return 0.0
        return max(0.0, self._resolved_at + self.resolve_every - self.clock())

    def lookup(self) -> set[str]:
        """The endpoints that should be peers now: the static ones and what each name resolves to."""
        self._resolved_at = self.clock()
        wanted, problem = set(self.static), None
        for named in self.named:
            try:
                self._found[named.endpoint] = set(discovery.resolve(named))
            except discovery.DiscoveryError as exc:
                problem = f"{named.endpoint}: {exc}"  # keep what it had: a failed lookup is not a fleet gone
            wanted |= self._found.get(named.endpoint, set())
        self.problem = problem
        return wanted

    def apply(self, wanted: set[str] | None) -> tuple[list[Peer], list[Peer]]:
        """(new peers, for the client to open; retired peers holding nothing now, for it to close)."""
        added = []
        if wanted is not None:
            for endpoint in sorted(wanted - self.peers.keys()):
                self.peers[endpoint] = peer = Peer(endpoint, endpoint, opened_at=self.clock())
                added.append(peer)
            for endpoint, peer in self.peers.items():
                peer.retiring = endpoint not in wanted
        closing = [peer for peer in self.peers.values() if peer.retiring and not peer.pending]
        for peer in closing:
            del self.peers[peer.endpoint]
        return added, closing

    def connect(self, peer: Peer, open_socket: Callable[[], Any]) -> Any:
        """The new peer's socket; one that cannot be opened (an endpoint ZeroMQ refuses) is no peer."""
        try:
            return open_socket()
        except ValueError:
            del self.peers[peer.endpoint]
            raise

    def candidates(self) -> list[Peer]:
        """The peers a request may go to now: those in the pool, else the draining ones."""
        pool = [p for p in self.peers.values() if p.usable]
        return pool or [p for p in self.peers.values() if p.draining and not (p.dropped or p.retiring)]

    def warming(self) -> bool:
        now = self.clock()
        return any(peer.warming(now) for peer in self.peers.values())

    def choose(self, key: str | None, blocked: set) -> Peer | None:
        """The peer for one request among the candidates not blocked this round; None when none is left."""
        pool = [p for p in self.candidates() if p not in blocked]
        return self.policy.choose(pool, key, self.clock()) if pool else None
