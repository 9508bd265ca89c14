"""clear_cache across the pool: every ready worker empties its prefix cache, and the control client
hears the total once each has answered or died (a dead worker's cache is gone with it)."""
from dataclasses import dataclass, field


@dataclass
class _Clear:
    waiter: tuple                   # (socket, envelope, request id) of the control client
    waiting: set = field(default_factory=set)    # identities of the workers yet to answer
    cleared: int = 0


class CacheClears:
    def __init__(self):
        self._pending: list[_Clear] = []

    def begin(self, waiter: tuple, identities: set) -> None:
        self._pending.append(_Clear(waiter, set(identities)))

    def answered(self, identity: bytes, cleared: int) -> list[tuple[tuple, int]]:
        """A worker's count; returns (waiter, total) for every clear now complete."""
        return self._settle(identity, cleared)

    def gone(self, identity: bytes) -> list[tuple[tuple, int]]:
        return self._settle(identity, 0)

    def _settle(self, identity: bytes, cleared: int) -> list[tuple[tuple, int]]:
        done = []
        for clear in self._pending:
            if identity in clear.waiting:
                clear.waiting.discard(identity)
                clear.cleared += cleared
            if not clear.waiting:
                done.append((clear.waiter, clear.cleared))
        self._pending = [c for c in self._pending if c.waiting]
        return done
