"""The gateway's DEALER to the supervisor (gateway/upstream.py) against a ROUTER in this test, over ipc."""
import asyncio
import threading

import msgpack
import pytest
import zmq

from jevany_client.errors import JevTimeoutError
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
