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
requests): a lookup sees only its own tenant's entries and the pinned head,
so whether a state is cached (a faster answer) tells nobody what another
tenant sent. Two tenants with the same state each compute it; the entry
holds the last one's.
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


class PrefixCache:
    def __init__(self, max_entries: int, max_bytes: int, min_tokens: int):
        self.max_entries, self.max_bytes, self.min_tokens = max_entries, max_bytes, min_tokens
        self._entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self._lock = threading.RLock()
        self.bytes = self._pinned = 0
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
        n, key = self._longest(tokens, tenant)
        if self.eligible(tokens):
            if n == len(tokens):
                self.hits += 1
            else:
                self.misses += 1
        if key is None:
            return 0, None
        self.reused_tokens += n
        self._entries.move_to_end(key)
        return n, self._entries[key].cache

    @_locked
    def peek(self, tokens: tuple[int, ...], tenant: str | None = None) -> int:
        """How many leading tokens an entry holds now; touches nothing (for cost estimates)."""
        return self._longest(tokens, tenant)[0]

    def _usable(self, entry: Entry, tenant: str | None) -> bool:
        return entry.pinned or entry.tenant == tenant

    def _longest(self, tokens: tuple[int, ...], tenant: str | None) -> tuple[int, tuple[int, ...] | None]:
        whole = self._entries.get(tokens)
        if whole is not None and self._usable(whole, tenant):
            return len(tokens), tokens
        best = None
        for key, entry in self._entries.items():
            n = len(key)
            # cheap tests first: most entries differ in their last token or are too long
            if (n < len(tokens) and (best is None or n > len(best)) and tokens[n - 1] == key[-1]
                    and tokens[:n] == key and self._usable(entry, tenant)):
                best = key
        return (0, None) if best is None else (len(best), best)

    @_locked
    def get(self, tokens: tuple[int, ...], tenant: str | None = None):
        """The cache computed for exactly these tokens, or None (a hit becomes the most recent)."""
        entry = self._entries.get(tokens)
        if entry is None or not self._usable(entry, tenant):
            if self.eligible(tokens):
                self.misses += 1
            return None
        return self.longest(tokens, tenant)[1]

    @_locked
    def put(self, tokens: tuple[int, ...], cache, extends: tuple[int, ...] | None = None,
            tenant: str | None = None) -> bool:
        """Keep cache for tokens, evicting the least recent entries to stay within the bounds.

        extends: the entry this one was computed from. It goes to the back of
        the queue, first out when room is needed: an agent's last turn is
        rarely asked about again once the next is in, but a shared context
        that many states extend keeps its place while there is room.
        """
        if not self.eligible(tokens):
            return False
        nbytes = cache_nbytes(cache)
        if nbytes > self.max_bytes:
            return False
        if tokens in self._entries and self._entries[tokens].pinned:
            return False       # the head is everyone's: a tenant's state never replaces it
        self.drop(tokens)
        self._entries[tokens] = Entry(cache, nbytes, tenant=tenant)
        self.generation += 1
        self.bytes += nbytes
        if extends in self._entries and not self._entries[extends].pinned:
            self._entries.move_to_end(extends, last=False)
        self._evict()
        return True

    @_locked
    def pin(self, tokens: tuple[int, ...], cache) -> bool:
        """Keep cache for tokens for good, whatever its length (the prompt's head), if the bytes allow."""
        entry = Entry(cache, cache_nbytes(cache), pinned=True)
        if entry.nbytes > self.max_bytes:
            return False
        self.drop(tokens)
        self._entries[tokens] = entry
        self.generation += 1
        self.bytes += entry.nbytes
        self._pinned += 1
        self._evict()
        return True

    @_locked
    def pinned_cache(self, tokens: tuple[int, ...]):
        """The cache pinned for exactly these tokens, or None; touches no counter and no order."""
        entry = self._entries.get(tokens)
        return entry.cache if entry is not None and entry.pinned else None

    @_locked
    def pinned(self) -> list[tuple[int, ...]]:
        return [key for key, entry in self._entries.items() if entry.pinned]

    def _evict(self) -> None:
        while len(self) > self.max_entries or self.bytes > self.max_bytes:
            victim = next((key for key, entry in self._entries.items() if not entry.pinned), None)
            if victim is None:
                return
            self.drop(victim)
            self.evictions += 1

    @_locked
    def drop(self, tokens: tuple[int, ...]) -> None:
        """Forget an entry, pinned or not (a pass that used it failed, so it may be what broke it)."""
        entry = self._entries.pop(tokens, None)
        if entry is not None:
            self.generation += 1
            self.bytes -= entry.nbytes
            self._pinned -= entry.pinned

    @_locked
    def reset(self) -> None:
        """Counters at zero and no states kept (after warm-up); a pinned head stays."""
        self.clear()
        self.hits = self.misses = self.evictions = self.reused_tokens = 0

    @_locked
    def clear(self) -> int:
        """Forget every state; returns how many there were. A pinned head stays: no state is in it."""
        states = [key for key, entry in self._entries.items() if not entry.pinned]
        for key in states:
            self.drop(key)
        return len(states)

    def __len__(self) -> int:
        """States held (the pinned head is not one)."""
        return len(self._entries) - self._pinned

    @_locked
    def keys(self) -> list[tuple[int, ...]]:
        """States held, least recent first."""
        return [key for key, entry in self._entries.items() if not entry.pinned]

    @_locked
    def stats(self) -> dict:
        return {"enabled": True, "size": len(self), "max_entries": self.max_entries, "bytes": self.bytes,
                "max_bytes": self.max_bytes, "min_tokens": self.min_tokens, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions, "reused_tokens": self.reused_tokens,
                "pinned_tokens": sum(len(key) for key in self.pinned())}


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
