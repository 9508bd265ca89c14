"""Hostile clients against the HTTP gateway: the gateway's reader of the daemon's replies while its loop is
busy.
"""
import asyncio
import select
import time

import msgpack
import pytest
import zmq

from jevany_client.errors import OverloadedError
from jevany_daemon.gateway.upstream import Upstream

MAX = 1 << 20


# --- the gateway's reader of the daemon's replies ------------------------------------------------------------


def test_a_reply_that_came_while_the_loop_was_busy_is_read_though_the_next_send_is_refused():
    # A send, even one refused because the pipe to the supervisor is full, takes in the socket's pending
    # commands, and with them the edge of its descriptor that said a reply had come. The refused send
    # raised before the drain that follows a send, so that reply sat unread until some later request
    # happened to drain the socket (the caller waited, its wait_s at most, with no CPU in use).
    upstream = Upstream("inproc://supervisor", MAX)
    # The supervisor in the gateway's own context, over inproc, with pipes of a message each way: a
    # supervisor that stops reading fills them at once and they stay full (no I/O thread moves bytes on).
    supervisor = upstream.ctx.socket(zmq.ROUTER)
    supervisor.setsockopt(zmq.LINGER, 0)
    supervisor.setsockopt(zmq.RCVHWM, 1)
    supervisor.bind("inproc://supervisor")
    upstream.sock.close()
    upstream.sock = upstream.ctx.socket(zmq.DEALER)
    upstream.sock.setsockopt(zmq.LINGER, 0)
    upstream.sock.setsockopt(zmq.SNDHWM, 1)
    upstream.sock.connect("inproc://supervisor")

    async def scenario():
        upstream.start()
        first = asyncio.ensure_future(upstream.call("ping", wait_s=30))
        await asyncio.sleep(0)                      # sent
        assert supervisor.poll(5000)
        routing, request = supervisor.recv_multipart()
        # The supervisor stops reading: requests fill the pipe until one is refused.
        pending = []
        while not pending or not pending[-1].done():
            assert len(pending) < 1000, "the pipe to the supervisor never filled"
            pending.append(asyncio.ensure_future(upstream.call("decide", {"state": "x"}, wait_s=30)))
            await asyncio.sleep(0)
        assert isinstance(pending[-1].exception(), OverloadedError)
        fd = upstream.sock.getsockopt(zmq.FD)
        upstream._drain()       # nothing came yet, and nothing else is pending: the descriptor is quiet
        assert not select.select([fd], [], [], 0)[0]
        # Now the loop is busy (a long synchronous parse): the reply comes, its edge on the descriptor...
        supervisor.send_multipart([routing, msgpack.packb({"v": 1, "id": msgpack.unpackb(request)["id"],
                                                           "ok": True, "result": {"pong": True}})])
        assert select.select([fd], [], [], 5)[0], "the reply never reached the gateway's socket"
        time.sleep(0.01)       # ...and the parse goes on (libzmq takes commands in on a send once a millisecond)
        # ...then the parse ends in a request the full pipe refuses.
        with pytest.raises(OverloadedError):
            await upstream.call("decide", {"state": "y"}, wait_s=30)
        try:
            return await asyncio.wait_for(first, 5)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            supervisor.close()
            await upstream.close()

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == {"pong": True}
