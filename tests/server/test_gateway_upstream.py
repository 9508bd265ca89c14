"""The gateway's DEALER to the supervisor (gateway/upstream.py) against a ROUTER in this test, over ipc."""
import asyncio
import threading

import msgpack
import pytest
import zmq

from jevany_client.errors import JevTimeoutError
from jevany_daemon import withdrawals
from jevany_daemon.gateway.upstream import TooLarge, Upstream


async def _exchange(endpoint: str, tenant: bytes | None, calls: int):
    """Each call's result through a real DEALER; the frames the ROUTER saw; what was left waiting."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    seen = []

    def answer():
        # As the supervisor does: the routing frames echoed back before the reply.
        while len(seen) < calls and router.poll(10_000):
            frames = router.recv_multipart()
            seen.append(frames[1:-1])
            request = msgpack.unpackb(frames[-1], raw=False)
            reply = msgpack.packb({"id": request["id"], "ok": True, "result": {"op": request["op"]}})
            router.send_multipart([*frames[:-1], reply])

    upstream = Upstream(endpoint, 1 << 20, tenant=tenant)
    upstream.start()
    try:
        answering = threading.Thread(target=answer)
        answering.start()
        results = [await upstream.call("status", wait_s=10) for _ in range(calls)]
        answering.join()
        return results, seen, dict(upstream._waiting)
    finally:
        await upstream.close()
        router.close()
        ctx.term()


@pytest.mark.parametrize("tenant", [None, b"salt"])
def test_replies_reach_their_calls_with_or_without_a_tenant_frame(tmp_path, tenant):
    results, seen, waiting = asyncio.run(_exchange(f"ipc://{tmp_path}/up.sock", tenant, 3))
    assert results == [{"op": "status"}] * 3
    assert seen == [[tenant] if tenant else []] * 3      # the tenant rides as one frame, or none at all
    assert waiting == {}                                  # nothing left behind once answered


def test_a_body_past_the_message_limit_is_never_sent(tmp_path):
    async def go():
        upstream = Upstream(f"ipc://{tmp_path}/up.sock", 100)
        upstream.start()
        try:
            with pytest.raises(TooLarge):
                await upstream.call("decide", {"state": "x" * 200})
            with pytest.raises(JevTimeoutError):       # nobody answers: the wait is bounded
                await upstream.call("status", wait_s=0.05)
            return dict(upstream._waiting)
        finally:
            await upstream.close()
    assert asyncio.run(go()) == {}


def test_a_cancelled_decide_is_withdrawn_after_its_tenant_frame_and_an_answered_or_status_call_is_not(tmp_path):
    endpoint = f"ipc://{tmp_path}/up.sock"

    async def go(router):
        upstream = Upstream(endpoint, 1 << 20, tenant=b"salt")
        upstream.start()
        loop = asyncio.get_running_loop()
        try:
            answered = loop.create_task(upstream.call("decide", {"state": "a"}, wait_s=10))
            left = loop.create_task(upstream.call("decide", {"state": "b"}, wait_s=10))
            status = loop.create_task(upstream.call("status", wait_s=10))
            frames = [await loop.run_in_executor(None, router.recv_multipart) for _ in range(3)]
            first = msgpack.unpackb(frames[0][-1], raw=False)
            router.send_multipart([*frames[0][:-1], msgpack.packb({"id": first["id"], "ok": True, "result": {}})])
            assert await answered == {}
            left.cancel(), status.cancel()
            with pytest.raises(asyncio.CancelledError):
                await left
            with pytest.raises(asyncio.CancelledError):
                await status
            # A ping after them on the same socket: what came before it is everything they sent.
            ping = loop.create_task(upstream.call("ping", wait_s=10))
            sent = []
            while not sent or withdrawals.decode(sent[-1][-1]) is not None:
                sent.append(await loop.run_in_executor(None, router.recv_multipart))
            ping.cancel()
            with pytest.raises(asyncio.CancelledError):
                await ping
            return [msgpack.unpackb(f[-1], raw=False)["id"] for f in frames], sent[:-1], dict(upstream._waiting)
        finally:
            await upstream.close()

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    try:
        ids, [withdrawal], waiting = asyncio.run(go(router))
    finally:
        router.close()
        ctx.term()
    assert withdrawal[1] == b"salt" and withdrawals.decode(withdrawal[-1]) == ids[1]
    assert waiting == {}
