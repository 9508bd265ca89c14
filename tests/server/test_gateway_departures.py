"""The route's wait on the daemon against its caller's connection (gateway/departures.py), on asyncio alone."""
import asyncio

import pytest

from jevany_daemon.gateway.departures import CallerGone, while_connected


class Connection:
    """An ASGI receive after the body was read: it returns only when the caller goes."""

    def __init__(self):
        self.closed = asyncio.Event()
        self.watching = 0

    async def receive(self):
        self.watching += 1
        await self.closed.wait()
        return {"type": "http.disconnect"}


def test_the_callers_departure_cancels_the_wait_and_says_so():
    async def go():
        conn, reply = Connection(), asyncio.get_running_loop().create_future()
        cancelled = []

        async def call():
            try:
                return await reply
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        route = asyncio.ensure_future(while_connected(conn.receive, call()))
        await asyncio.sleep(0)       # the route starts, and its watcher with it
        conn.closed.set()
        with pytest.raises(CallerGone):
            await route
        return cancelled, route.cancelling()

    cancelled, cancelling = asyncio.run(go())
    assert cancelled == [True]      # the upstream call saw its cancellation: it withdraws its request
    assert cancelling == 0          # the route itself is not left cancelled: it goes on to answer


def test_an_answer_first_is_returned_and_a_later_departure_cancels_nothing():
    async def go():
        conn = Connection()

        async def call():
            for _ in range(3):          # the watcher is running and waiting by the time the answer comes
                await asyncio.sleep(0)
            return {"answer": 1}

        async def route():
            result = await while_connected(conn.receive, call())
            conn.closed.set()          # the caller leaves after its answer, while the route still runs
            for _ in range(5):
                await asyncio.sleep(0)
            return result

        task = asyncio.ensure_future(route())
        return await task, conn.watching, task.cancelling()

    assert asyncio.run(go()) == ({"answer": 1}, 1, 0)


def test_a_cancellation_from_elsewhere_is_not_taken_for_a_departure():
    async def go():
        conn, reply = Connection(), asyncio.get_running_loop().create_future()
        route = asyncio.ensure_future(while_connected(conn.receive, reply))
        await asyncio.sleep(0)
        route.cancel()                 # the server stopping: the route must end, not answer
        with pytest.raises(asyncio.CancelledError):
            await route
        return reply.cancelled()

    assert asyncio.run(go())


def test_a_departure_as_the_answer_comes_leaves_the_answer_and_the_route_alone():
    async def go():
        conn, reply = Connection(), asyncio.get_running_loop().create_future()

        async def route():
            result = await while_connected(conn.receive, reply)
            for _ in range(5):         # the watcher's callback runs on a later turn: it must cancel nothing
                await asyncio.sleep(0)
            return result

        task = asyncio.ensure_future(route())
        await asyncio.sleep(0)
        conn.closed.set()              # the watcher wakes first, then the route with its answer
        reply.set_result({"answer": 2})
        return await task, task.cancelling()

    assert asyncio.run(go()) == ({"answer": 2}, 0)


def test_a_departure_and_a_cancellation_from_elsewhere_together_end_the_route():
    async def go():
        conn, reply = Connection(), asyncio.get_running_loop().create_future()
        route = asyncio.ensure_future(while_connected(conn.receive, reply))
        await asyncio.sleep(0)
        conn.closed.set()
        route.cancel()
        with pytest.raises(asyncio.CancelledError):
            await route

    asyncio.run(go())


def test_a_receive_that_fails_counts_as_a_departure():
    async def go():
        async def broken():
            raise OSError("the connection is gone")

        with pytest.raises(CallerGone):
            await while_connected(broken, asyncio.get_running_loop().create_future())

    asyncio.run(go())
