"""as_they_finish: a bounded number in flight, outcomes as they come, read from the source only as slots free."""
import asyncio

import pytest

from jevany_client.errors import InternalError, InvalidRequestError, OverloadedError
from jevany_client.streaming import as_they_finish


def run(coroutine):
    return asyncio.run(coroutine)


def test_never_more_than_in_flight_and_every_item_once():
    state = {"now": 0, "most": 0}

    async def call(item):
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        await asyncio.sleep(0.001 * (item % 3))        # finishing out of order
        state["now"] -= 1
        return item * 10

    async def collect():
        return [pair async for pair in as_they_finish(range(200), 7, call)]

    got = run(collect())
    assert sorted(got) == [(i, i * 10) for i in range(200)] and state["most"] == 7
    assert [i for i, _ in got] != list(range(200))      # handed on as they finish, not in order


def test_the_first_outcome_comes_before_the_source_is_read_to_its_end():
    read = []

    async def source():
        for i in range(1000):
            read.append(i)
            yield i
            await asyncio.sleep(0)

    async def call(item):
        return item

    async def first():
        outcomes = as_they_finish(source(), 4, call)
        index, _ = await anext(outcomes)
        seen = len(read)
        await outcomes.aclose()
        return index, seen

    index, seen = run(first())
    assert index == 0 and seen <= 5          # 4 in flight, and the one being read


def test_an_outcome_waits_for_no_slow_source():
    # The source stalls after two items; their answers must come out meanwhile.
    stalled = asyncio.Event

    async def scenario():
        gate = stalled()

        async def source():
            yield 1
            yield 2
            await gate.wait()
            yield 3

        async def call(item):
            return item

        outcomes = as_they_finish(source(), 8, call)
        first = [await anext(outcomes), await anext(outcomes)]
        gate.set()
        rest = [pair async for pair in outcomes]
        return first, rest

    first, rest = run(scenario())
    assert sorted(first) == [(0, 1), (1, 2)] and rest == [(2, 3)]


def test_errors_are_each_item_s_own():
    async def call(item):
        if item == 1:
            raise OverloadedError("busy")
        if item == 2:
            raise KeyError("a bug")
        return item

    async def collect():
        items = [0, 1, 2, InvalidRequestError("unreadable line"), 4]
        return dict([pair async for pair in as_they_finish(items, 2, call)])

    got = run(collect())
    assert got[0] == 0 and got[4] == 4
    assert isinstance(got[1], OverloadedError) and isinstance(got[3], InvalidRequestError)
    assert isinstance(got[2], InternalError) and "KeyError" in got[2].message


def test_closing_early_cancels_what_is_in_flight():
    cancelled, started = [], []

    async def scenario():
        all_started = asyncio.Event()

        async def call(item):
            started.append(item)
            if len(started) == 4:
                all_started.set()
            try:
                if item == 0:
                    await all_started.wait()     # the first answer comes once four are in flight
                else:
                    await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(item)
                raise
            return item

        outcomes = as_they_finish(range(10), 4, call)
        assert await anext(outcomes) == (0, 0)
        await outcomes.aclose()
        await asyncio.sleep(0)

    run(scenario())
    assert sorted(started) == [0, 1, 2, 3] and sorted(cancelled) == [1, 2, 3]


def test_in_flight_must_be_positive():
    async def call(item):
        return item

    async def scenario():
        async for _ in as_they_finish([1], 0, call):
            pass

    with pytest.raises(ValueError, match="in_flight must be at least 1"):
        run(scenario())
