"""The engine's memory of prefixes it already computed: one request's decoder cache per prefix.

It knows token ids and cache objects, never sockets or requests. Entries are
least-recently-used first out, bounded in number and in bytes, so a cache on
a GPU cannot starve the batches of memory. A prefix shorter than
min_tokens is not worth an entry: recomputing it costs less than the copy.
"""
from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class Entry:
    cache: object     # a decoder cache holding one row: the prefix's keys, values and recurrent states
    nbytes: int


class PrefixCache:
    def __init__(self, max_entries: int, max_bytes: int, min_tokens: int):
        self.max_entries, self.max_bytes, self.min_tokens = max_entries, max_bytes, min_tokens
        self._entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0

    def eligible(self, tokens: tuple[int, ...]) -> bool:
        return len(tokens) >= self.min_tokens

    def get(self, tokens: tuple[int, ...]):
        """The cache computed for exactly these tokens, or None; a hit becomes the most recent."""
        if not self.eligible(tokens):
            return None
        entry = self._entries.get(tokens)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(tokens)
        return entry.cache

    def put(self, tokens: tuple[int, ...], cache) -> bool:
        """Keep cache for tokens, evicting the least recent entries to stay within the bounds."""
        if not self.eligible(tokens):
            return False
        nbytes = cache_nbytes(cache)
        if nbytes > self.max_bytes:
            return False
        self.drop(tokens)
        self._entries[tokens] = Entry(cache, nbytes)
        self.bytes += nbytes
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.nbytes
            self.evictions += 1
        return True

    def drop(self, tokens: tuple[int, ...]) -> None:
        """Forget an entry (a pass that used it failed, so it may be what broke it)."""
        entry = self._entries.pop(tokens, None)
        if entry is not None:
            self.bytes -= entry.nbytes

    def reset(self) -> None:
        """Empty, with counters at zero (after warm-up)."""
        self.clear()
        self.hits = self.misses = self.evictions = 0

    def clear(self) -> int:
        dropped = len(self._entries)
        self._entries.clear()
        self.bytes = 0
        return dropped

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[tuple[int, ...]]:
        """Least recent first."""
        return list(self._entries)

    def stats(self) -> dict:
        return {"enabled": True, "size": len(self), "max_entries": self.max_entries, "bytes": self.bytes,
                "max_bytes": self.max_bytes, "min_tokens": self.min_tokens, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions}


def cache_nbytes(cache) -> int:
    """Bytes of every tensor a decoder cache holds (attention keys and values, recurrent and conv states)."""
    total = 0
    for layer in cache.layers:
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                total += value.nbytes
            elif isinstance(value, dict):
                total += sum(v.nbytes for v in value.values() if isinstance(v, torch.Tensor))
    return total
