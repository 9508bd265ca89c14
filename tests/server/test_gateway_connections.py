"""What connections may hold (gateway/connections.py): the buffers' budget and the connection limit, in process."""
import asyncio
import resource

from jevany_daemon.gateway import connections
from jevany_daemon.gateway.connections import BUFFER_LOW_WATER, FD_SHARE, MAX_CONNECTIONS, Buffers


class Connection:
    """A connection as Buffers sees it: what it holds, and until when its client is taken to be reading."""

    def __init__(self, name: str, holds: int, reading_for: float = 0.0):
        self.name, self.holds, self.reading_for, self.dropped = name, holds, reading_for, False

    def held(self) -> int:
        return 0 if self.dropped else self.holds

    def reading_until(self, now: float) -> float:
        return now + self.reading_for

    def drop(self) -> None:
        self.dropped = True


def _settle(budget: int, conns: list[Connection]) -> tuple[int, list[str]]:
    async def go():
        buffers = Buffers(budget)
        total = buffers.settle(conns)
        if buffers.again is not None:
            buffers.again.cancel()
        return total, [c.name for c in conns if c.dropped]
    return asyncio.run(go())


def test_within_the_budget_nobody_is_reset():
    assert _settle(1000, [Connection("a", 600), Connection("b", 400)]) == (1000, [])


def test_past_the_budget_those_holding_most_go_first_down_to_the_low_water():
    conns = [Connection("small", 100), Connection("big", 700), Connection("mid", 300), Connection("tiny", 50)]
    # 1150 held, budget 1000: the biggest (700) leaves 450, under the low water (750), and no more go
    assert _settle(1000, conns) == (450, ["big"])
    # the low water, not the budget, is where resets stop: 1150 - 300 = 850 is within the budget but above it
    conns = [Connection("a", 300), Connection("b", 300), Connection("c", 300), Connection("d", 250)]
    total, dropped = _settle(1000, conns)
    assert total <= 1000 * BUFFER_LOW_WATER and len(dropped) == 2


def test_a_client_that_reads_keeps_its_connection_and_one_whose_grace_just_ended_does_not():
    conns = [Connection("reading", 900, reading_for=1.0), Connection("stopped", 400, reading_for=0.0)]
    assert _settle(1000, conns) == (900, ["stopped"])


def test_connections_are_a_share_of_the_descriptor_limit_within_bounds(monkeypatch):
    seen = {}
    for soft in (10, 1024, 1 << 20):
        monkeypatch.setattr(resource, "getrlimit", lambda _kind, soft=soft: (soft, soft))
        seen[soft] = connections.max_connections()
    assert seen == {10: 16, 1024: int(1024 * FD_SHARE), 1 << 20: MAX_CONNECTIONS}
