"""The engine's memory of prefixes it already computed: one request's decoder cache per prefix.

It knows token ids and cache objects, never sockets or requests. Entries are
least-recently-used first out, bounded in number and in bytes, so a cache on
a GPU cannot starve the batches of memory. A state shorter than min_tokens
is not worth an entry of its own: recomputing it costs less than the copy.

A lookup finds the longest entry the tokens start with, so a state that
extends a kept one (an agent's next turn) computes only what is new. The
prompt's head, the same in every request, is pinned: never evicted, never
cleared, and outside the entry count.

Entries belong to a tenant (the salt the daemon gives each connection's
requests) and are keyed by tenant and tokens: a lookup sees only its own
tenant's entries and the pinned head, and nothing one tenant sends replaces
or reveals an entry of another's. Two tenants with the same state each
compute and keep it. When the bounds are reached, the tenant holding the
most (bytes when the byte bound is passed, entries otherwise) loses its
least recent entry: a tenant that floods the cache evicts its own states,
and each of n tenants keeps at least about 1/n of the cache.
"""
import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch


def _locked(method):
    # In-process callers estimate a request's cost (peek) on their own threads
    # while the thread running a pass updates the cache.
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return run


@dataclass
class Entry:
    cache: object     # a block of one row (cache_rows.py): the prefix's keys, values and recurrent states
    nbytes: int
    pinned: bool = False
    tenant: str | None = None   # who may use it; a pinned entry is everyone's


Key = tuple  # (tenant, tokens) of a state; a pinned head is keyed by its tokens alone, in _heads


class PrefixCache:
    def __init__(self, max_entries: int, max_bytes: int, min_tokens: int):
        self.max_entries, self.max_bytes, self.min_tokens = max_entries, max_bytes, min_tokens
        self._entries: OrderedDict[Key, Entry] = OrderedDict()    # states, least recent first
        self._heads: dict[tuple[int, ...], Entry] = {}
        self._held: dict[str | None, list[int]] = {}              # tenant -> [entries, bytes]
        self._lock = threading.RLock()
        self.bytes = 0
        self.generation = 0      # bumped whenever what a lookup could find changes (costs remembered by it)
        self.reset()

    def eligible(self, tokens: tuple[int, ...]) -> bool:
        return len(tokens) >= self.min_tokens

    @_locked
    def longest(self, tokens: tuple[int, ...], tenant: str | None = None) -> tuple[int, object]:
        """(n, cache) of the longest entry that tokens start with; (0, None) when none does.

        The entry used becomes the most recent. A state worth an entry counts
        a hit when it is held whole, else a miss; reused_tokens counts what
        any lookup saved computing.
        """
        n, entry = self._longest(tokens, tenant)
        if self.eligible(tokens):
            if n == len(tokens):
                self.hits += 1
            else:
                self.misses += 1
        if entry is None:
            return 0, None
        self.reused_tokens += n
        if not entry.pinned:
            self._entries.move_to_end((tenant, tokens[:n]))
        return n, entry.cache

    @_locked
    def peek(self, tokens: tuple[int, ...], tenant: str | None = None) -> int:
        """How many leading tokens an entry holds now; touches nothing (for cost estimates)."""
        return self._longest(tokens, tenant)[0]

    def _longest(self, tokens: tuple[int, ...], tenant: str | None) -> tuple[int, Entry | None]:
        whole = self._entries.get((tenant, tokens)) or self._heads.get(tokens)
        if whole is not None:
            return len(tokens), whole
        best, found = 0, None
        for key, entry in [*self._heads.items(), *((k[1], e) for k, e in self._entries.items() if k[0] == tenant)]:
            n = len(key)
            # cheap tests first: most entries differ in their last token or are too long
            if best < n < len(tokens) and tokens[n - 1] == key[-1] and tokens[:n] == key:
                best, found = n, entry
        return best, found

    @_locked
    def get(self, tokens: tuple[int, ...], tenant: str | None = None):
        """The cache computed for exactly these tokens, or None (a hit becomes the most recent)."""
        if (tenant, tokens) not in self._entries and tokens not in self._heads:
            if self.eligible(tokens):
                self.misses += 1
            return None
        return self.longest(tokens, tenant)[1]

    @_locked
    def put(self, tokens: tuple[int, ...], cache, extends: tuple[int, ...] | None = None,
            tenant: str | None = None) -> bool:
        """Keep cache for tokens as tenant's, evicting to stay within the bounds (the largest holder first).

        extends: the entry this one was computed from. It goes to the front of
        its tenant's queue, first out when room is needed: an agent's last turn
        is rarely asked about again once the next is in, but a shared context
        that many states extend keeps its place while there is room.
        """
        if not self.eligible(tokens) or tokens in self._heads:    # the head is everyone's already
            return False
        nbytes = cache_nbytes(cache)
        if nbytes > self.max_bytes:
            return False
        self.drop(tokens, tenant)
        self._entries[(tenant, tokens)] = Entry(cache, nbytes, tenant=tenant)
        held = self._held.setdefault(tenant, [0, 0])
        held[0] += 1
        held[1] += nbytes
        self.generation += 1
        self.bytes += nbytes
        if extends is not None and (tenant, extends) in self._entries:
            self._entries.move_to_end((tenant, extends), last=False)
        self._evict()
        return True

    @_locked
    def pin(self, tokens: tuple[int, ...], cache) -> bool:
        """Keep cache for tokens for good, whatever its length (the prompt's head), if the bytes allow."""
        entry = Entry(cache, cache_nbytes(cache), pinned=True)
        if entry.nbytes > self.max_bytes:
            return False
        self.unpin(tokens)
        self._heads[tokens] = entry
        self.generation += 1
        self.bytes += entry.nbytes
        self._evict()
        return True

    @_locked
    def unpin(self, tokens: tuple[int, ...]) -> None:
        """Forget a pinned head (a pass that used it failed, so it may be what broke it)."""
        entry = self._heads.pop(tokens, None)
        if entry is not None:
            self.generation += 1
            self.bytes -= entry.nbytes

    @_locked
    def pinned_cache(self, tokens: tuple[int, ...]):
        """The cache pinned for exactly these tokens, or None; touches no counter and no order."""
        entry = self._heads.get(tokens)
        return entry.cache if entry is not None else None

    @_locked
    def pinned(self) -> list[tuple[int, ...]]:
        return list(self._heads)

    def _evict(self) -> None:
        while self._entries and (len(self) > self.max_entries or self.bytes > self.max_bytes):
            measure = 1 if self.bytes > self.max_bytes else 0
            most = max(held[measure] for held in self._held.values())
            # the least recent entry of a tenant holding the most: a flood evicts the flooder's own states
            victim = next(key for key in self._entries if self._held[key[0]][measure] == most)
            self.drop(victim[1], victim[0])
            self.evictions += 1

    @_locked
    def drop(self, tokens: tuple[int, ...], tenant: str | None = None) -> None:
        """Forget tenant's entry for tokens, or the pinned head of these tokens (a failed pass read it)."""
        entry = self._entries.pop((tenant, tokens), None)
        if entry is None:
            self.unpin(tokens)
            return
        self.generation += 1
        self.bytes -= entry.nbytes
        held = self._held[tenant]
        held[0] -= 1
        held[1] -= entry.nbytes
        if not held[0]:
            del self._held[tenant]

    @_locked
    def reset(self) -> None:
        """Counters at zero and no states kept (after warm-up); a pinned head stays."""
        self.clear()
        self.hits = self.misses = self.evictions = self.reused_tokens = 0

    @_locked
    def clear(self) -> int:
        """Forget every state; returns how many there were. A pinned head stays: no state is in it."""
        states = list(self._entries)
        for tenant, tokens in states:
            self.drop(tokens, tenant)
        return len(states)

    def __len__(self) -> int:
        """States held (the pinned head is not one)."""
        return len(self._entries)

    @_locked
    def keys(self, tenant: str | None = None) -> list[tuple[int, ...]]:
        """Tenant's states held, least recent first."""
        return [tokens for owner, tokens in self._entries if owner == tenant]

    @_locked
    def entry(self, tokens: tuple[int, ...], tenant: str | None = None) -> Entry | None:
        """Tenant's entry for exactly these tokens, or the pinned head of them; touches nothing."""
        return self._entries.get((tenant, tokens)) or self._heads.get(tokens)

    @_locked
    def entries(self) -> list[Entry]:
        """Every entry held, the pinned heads first (for tests and measurements)."""
        return [*self._heads.values(), *self._entries.values()]

    @_locked
    def tenants(self) -> dict[str | None, tuple[int, int]]:
        """(entries, bytes) each tenant holds now."""
        return {tenant: (n, nbytes) for tenant, (n, nbytes) in self._held.items()}

    @_locked
    def stats(self) -> dict:
        return {"enabled": True, "size": len(self), "max_entries": self.max_entries, "bytes": self.bytes,
                "max_bytes": self.max_bytes, "min_tokens": self.min_tokens, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions, "reused_tokens": self.reused_tokens,
                "pinned_tokens": sum(len(key) for key in self._heads)}


def cache_nbytes(cache) -> int:
    """Bytes of every tensor a decoder cache holds (attention keys and values, recurrent and conv states)."""
    if isinstance(getattr(cache, "nbytes", None), int):     # a cache_rows.Block
        return cache.nbytes
    total = 0
    for layer in cache.layers:
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                total += value.nbytes
            elif isinstance(value, dict):
                total += sum(v.nbytes for v in value.values() if isinstance(v, torch.Tensor))
    return total
