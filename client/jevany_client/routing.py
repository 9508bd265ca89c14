"""Which daemon gets a request: the routing policies, with no sockets in them.

A client connected to several daemons holds one socket per daemon (a Peer)
and asks its policy for a peer for each request it sends:

    round_robin   each usable peer in turn, blind to load (what one DEALER over
                  every endpoint did);
    least_loaded  power of two choices: two peers drawn at random, the less
                  loaded one taken. A peer's load is the client's own requests
                  in flight there plus the other clients' work the daemon last
                  reported (the `load` of its replies, PROTOCOL.md), fading with
                  the report's age, so a slow daemon that builds a queue loses the
                  draws, and one not heard from for a while is tried again;
    affinity      consistent hashing with bounded loads (Mirrokni, Thorup and
                  Zadimoghaddam): a request's key picks a point on a ring of
                  the peers, and the first peer clockwise whose load is under
                  BALANCE_FACTOR times the mean takes it. One key keeps to one
                  daemon (its prefix cache holds that agent's transcript) until
                  that daemon is over its bound, when the key spills to the next.

A request's key is the caller's `affinity=`, else affinity_key(state): a
digest of the leading AFFINITY_PREFIX_BYTES of the state's canonical JSON,
which a transcript that grows at its end keeps from turn to turn.
"""

import bisect
import hashlib
import json
import math
import random
from collections.abc import Sequence
from typing import Any, Protocol

ROUTINGS = ("least_loaded", "affinity", "round_robin")
BALANCE_FACTOR = 1.25          # c: no peer takes more than c times the mean load (the bound is rounded up)
AFFINITY_PREFIX_BYTES = 1024
RING_POINTS = 100              # points per peer on the ring: the spread of keys is even within a few percent
REPORT_HALF_LIFE_S = 5.0       # a daemon's reported load counts half as much this much later


class Routed(Protocol):
    """What a policy reads of a peer."""

    key: str                    # its name on the ring: stable while the daemon is the same one

    def load(self, now: float) -> int: ...


def affinity_key(state: Any) -> str:
    """The digest of the state's leading part, as the default affinity key and the eval's shard key."""
    encoder = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    head = bytearray()
    for chunk in encoder.iterencode(state):     # a long state is encoded only as far as its head
        head += chunk.encode()
        if len(head) >= AFFINITY_PREFIX_BYTES:
            break
    return hashlib.sha256(bytes(head[:AFFINITY_PREFIX_BYTES])).hexdigest()[:16]


def check_routing(routing: str | None, several: bool) -> str:
    """The policy's name; None picks least_loaded for several daemons (round_robin for one, the same)."""
    if routing is None:
        return "least_loaded" if several else "round_robin"
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    return routing


def make_policy(routing: str, rng: random.Random | None = None):
    rng = rng or random.Random()
    return {"round_robin": RoundRobin, "least_loaded": LeastLoaded, "affinity": Affinity}[routing](rng)


class RoundRobin:
    def __init__(self, rng: random.Random) -> None:
        self._turn = 0

    def choose(self, peers: Sequence[Routed], key: str | None, now: float) -> Routed:
        self._turn += 1
        return peers[self._turn % len(peers)]


class LeastLoaded:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, peers: Sequence[Routed], key: str | None, now: float) -> Routed:
        if len(peers) == 1:
            return peers[0]
        a, b = self._rng.sample(range(len(peers)), 2)
        # Two draws, not the least loaded of all: every client chasing the one idlest
        # daemon with the same stale reports would flood it together.
        return peers[a] if peers[a].load(now) <= peers[b].load(now) else peers[b]


class Affinity:
    def __init__(self, rng: random.Random) -> None:
        self._fallback = LeastLoaded(rng)
        self._names: frozenset[str] = frozenset()
        self._points: list[int] = []
        self._owners: list[str] = []

    def choose(self, peers: Sequence[Routed], key: str | None, now: float) -> Routed:
        if key is None or len(peers) == 1:
            return self._fallback.choose(peers, key, now)
        by_name = {peer.key: peer for peer in peers}
        self._build(frozenset(by_name))
        loads = {name: peer.load(now) for name, peer in by_name.items()}
        bound = math.ceil(BALANCE_FACTOR * (sum(loads.values()) + 1) / len(loads))
        start = bisect.bisect(self._points, _point(key))
        seen = set()
        for step in range(len(self._owners)):
            name = self._owners[(start + step) % len(self._owners)]
            if name in seen:
                continue
            seen.add(name)
            if loads[name] + 1 <= bound:
                return by_name[name]
        # Unreachable while the bound is at least the mean plus one, kept as a guard.
        return min(peers, key=lambda peer: loads[peer.key])

    def _build(self, names: frozenset[str]) -> None:
        """The ring of the peers usable now; a peer that leaves moves only its own keys."""
        if names == self._names:
            return
        ring = sorted((_point(f"{name}#{i}"), name) for name in names for i in range(RING_POINTS))
        self._names = names
        self._points = [point for point, _ in ring]
        self._owners = [name for _, name in ring]


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
