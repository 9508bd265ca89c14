"""Many requests, a bounded number in flight, each outcome handed on as soon as it is in.

What AsyncJevClient.decide_stream and the HTTP gateway's bulk route share:
items are read from their source only while a slot is free, so a source of
any length (a file, a request body still arriving) costs at most `in_flight`
requests at once; an outcome is yielded the moment it is in, while the next
item is still being read. Each item's outcome is its result or its own
exception, never one for the whole stream.
"""
import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from .errors import InternalError, JevanyError


async def as_they_finish(items: AsyncIterable | Iterable, in_flight: int,
                         call: Callable[[Any], Awaitable[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """(index, outcome) for each item, in the order they finish: call(item)'s result, or the exception it
    raised (a JevanyError; anything else as InternalError). An item that is itself an exception (one its
    source could not read) is its own outcome, at once. Closing the generator cancels what is in flight."""
    if in_flight < 1:
        raise ValueError(f"in_flight must be at least 1, got {in_flight}")
    source = _aiter(items)
    pending: dict[asyncio.Future, int] = {}
    reading: asyncio.Future | None = None
    index = 0
    try:
        while True:
            if reading is None and source is not None and len(pending) < in_flight:
                reading = asyncio.ensure_future(anext(source))
            if reading is None and not pending:
                return
            done, _ = await asyncio.wait([*pending, *([reading] if reading else [])],
                                         return_when=asyncio.FIRST_COMPLETED)
            if reading in done:
                done.discard(reading)
                try:
                    item = reading.result()
                except StopAsyncIteration:
                    source = None
                else:
                    if isinstance(item, BaseException):
                        yield index, item
                    else:
                        pending[asyncio.ensure_future(call(item))] = index
                    index += 1
                reading = None
            for task in done:
                yield pending.pop(task), _outcome(task)
    finally:
        for task in [*pending, *([reading] if reading else [])]:
            task.cancel()


def _outcome(task: asyncio.Future) -> Any:
    if task.cancelled():        # by someone else: this item's outcome, not the stream's end
        return InternalError("the request was cancelled")
    error = task.exception()
    if error is None:
        return task.result()
    if isinstance(error, JevanyError):
        return error
    return InternalError(f"{type(error).__name__}: {error}")


async def _aiter(items: AsyncIterable | Iterable) -> AsyncIterator:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
