"""The async client's backlog: requests made while no daemon can take them leave in the order they were made."""
import asyncio
from types import SimpleNamespace

from jevany_client import AsyncJevClient


def test_requests_made_while_the_socket_is_busy_go_out_in_the_order_they_were_made():
    async def main():
        client = AsyncJevClient("ipc:///nonexistent/jevany-backlog.sock", timeout=5.0)
        loop = asyncio.get_running_loop()
        client._loop, client._changed = loop, asyncio.Event()
        client._fleet = SimpleNamespace(warming=lambda: True)       # the flusher looks again every WARMING_LOOK_S
        busy, sent = [True], []

        def send_now(rid, entry):       # the socket: refuses while busy, as zmq.Again does
            if busy[0]:
                return False
            sent.append(rid)
            return True

        client._send_now = send_now

        def make(rid):
            return loop.create_task(client._deliver(rid, SimpleNamespace(future=loop.create_future())))

        first = [make(f"r{i}") for i in range(5)]
        async def queued(n):
            while len(client._backlog) < n:
                await asyncio.sleep(0)              # each task runs to its first wait: the loop's turn, no clock

        await asyncio.wait_for(queued(5), 5)        # all five queued behind the busy socket
        assert sent == [] and [rid for rid, _, _ in client._backlog] == [f"r{i}" for i in range(5)]
        busy[0] = False
        later = [make(f"r{i}") for i in range(5, 8)]    # made before the flusher has looked again
        await asyncio.wait_for(asyncio.gather(*first, *later), 5)
        assert sent == [f"r{i}" for i in range(8)]
        assert not client._backlog

    asyncio.run(main())
