"""Hostile HTTP clients against one daemon's gateway: bodies that trickle or hog, answers nobody reads, and
the gateway's reader of the daemon's replies while its loop is busy.

The daemon runs with --max-message-bytes 1 MiB, so its gateway's bounds are small: 8 MiB of bodies (4 MiB
of them for one client) and 8 MiB of connection buffers. Clients bound to other loopback addresses
(127.0.0.2, ...) stand for other hosts.
"""
import asyncio
import json
import os
import select
import socket
import time
from collections import Counter

import msgpack
import pytest
import zmq

from jevany_client.errors import OverloadedError
from jevany_daemon.gateway.connections import BUFFER_LOW_WATER, Buffers
from jevany_daemon.gateway.guard import BODY_BUDGET_MESSAGES, BODY_GRACE_S, CLIENT_SHARE_MESSAGES
from jevany_daemon.gateway.upstream import TooLarge, Upstream

from .daemons import rss_kb, wait_for
from .http_proc import free_port
from .shared_daemons import running_daemon
from .test_hostile_clients import _read_reply, _status_line

MAX = 1 << 20
TEXT = json.dumps({"state": {"ticket": "parcel lost"}, "questions": {"u": {"type": "noul"}}}).encode()


@pytest.fixture(scope="module")
def daemon(tiny_model):
    port = free_port()
    with running_daemon(tiny_model("qwen3", "choice"), "--http", f"127.0.0.1:{port}",
                        "--max-message-bytes", str(MAX)) as d:
        d.port = port
        wait_for(lambda: _healthy(port), 60, "the gateway answering /health")
        with d.control_client(timeout=30) as control:
            d.gateway = control.status()["http"]["pid"]
        yield d


def _connect(port: int, source: str = "127.0.0.1", rcvbuf: int | None = None) -> socket.socket:
    conn = socket.socket()
    if rcvbuf:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)    # before connect: the window it offers
    conn.settimeout(10)
    conn.bind((source, 0))
    conn.connect(("127.0.0.1", port))
    return conn


def _head(length: int, extra: bytes = b"") -> bytes:
    return (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
            b"Content-Length: %d\r\n\r\n" % (extra, length))


def _post(port: int, body: bytes, source: str = "127.0.0.1") -> bytes:
    with _connect(port, source) as conn:
        conn.sendall(_head(len(body)) + body)
        return _read_reply(conn)


def _healthy(port: int) -> bool:
    try:
        with _connect(port) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            return _read_reply(conn).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _readable(conn) -> bool:
    """Whether the gateway has sent something on conn (or closed it), without waiting."""
    return bool(select.select([conn], [], [], 0)[0])


def _until_closed(conn) -> bytes:
    """All the gateway sends on conn until it closes it (10 s at most, then the test fails)."""
    data = b""
    try:
        while chunk := conn.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


# --- bodies: counted as they come, at a minimum rate, within one client's share -----------------------------


def test_bodies_that_declare_much_and_send_little_lock_nobody_out_and_are_refused_once_too_slow(daemon):
    # Eight bodies each declare the cap and send a byte a second. The budget was reserved by declared
    # bytes: eight of them held all of it, and every other POST got 429 until the body deadline (60 s).
    slow = [_connect(daemon.port) for _ in range(BODY_BUDGET_MESSAGES)]
    try:
        for conn in slow:
            conn.sendall(_head(MAX))
        statuses, replies = Counter(), {}
        deadline, next_byte = time.monotonic() + BODY_GRACE_S + 20, 0.0
        while len(replies) < len(slow) and time.monotonic() < deadline:
            statuses[_status_line(_post(daemon.port, TEXT))] += 1
            for conn in slow:
                if conn in replies:
                    continue
                if _readable(conn):
                    replies[conn] = _until_closed(conn)
                elif time.monotonic() >= next_byte:
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        pass            # refused and closed since it was looked at: read next turn
            if time.monotonic() >= next_byte:
                next_byte = time.monotonic() + 1.0
            time.sleep(0.1)       # the legitimate client's pace, not a wait for anything
        assert statuses[200] >= 0.95 * sum(statuses.values()), statuses
        assert len(replies) == len(slow), f"{len(slow) - len(replies)} trickling bodies kept past the grace"
        for reply in replies.values():
            assert _status_line(reply) == 408 and b"x-jevany-daemon-error: timeout" in reply.lower(), reply[:300]
            assert b"connection: close" in reply.lower()
    finally:
        for conn in slow:
            conn.close()


def test_one_client_holds_at_most_its_share_of_the_bodies_and_others_are_still_served(daemon):
    # One client sends bodies of nearly the cap and holds back their last byte. It may hold
    # CLIENT_SHARE_MESSAGES such bodies; the next is refused as it passes that share, and other clients
    # are served meanwhile, a body of half the cap included. (With bodies counted as declared and no share,
    # one client held all five, and with three more connections, all of the budget.) Each names another
    # address in X-Forwarded-For, which uvicorn believes from 127.0.0.1: here it names nobody.
    hogs = [_connect(daemon.port) for _ in range(CLIENT_SHARE_MESSAGES + 1)]
    try:
        for i, conn in enumerate(hogs):
            conn.sendall(_head(MAX, b"X-Forwarded-For: 10.9.9.%d\r\n" % i) + b" " * (MAX - 1))
        refused = wait_for(lambda: [c for c in hogs if _readable(c)], 30, "a body past its client's share refused")
        assert len(refused) == 1
        reply = _until_closed(refused[0])
        assert _status_line(reply) == 429 and b"retry-after: 1" in reply.lower(), reply[:300]
        assert _status_line(_post(daemon.port, TEXT + b" " * (MAX // 2), "127.0.0.3")) == 200
        assert not any(_readable(c) for c in hogs if c is not refused[0])     # the share's four still held
    finally:
        for conn in hogs:
            conn.close()
    # Gone, the bodies it held are let go: the same client is served again.
    wait_for(lambda: _status_line(_post(daemon.port, TEXT + b" " * (MAX // 2))) == 200, 10,
             "the client's share given back")


# --- what connections buffer: one bound across them all ----------------------------------------------------


def _echoed(size: int) -> bytes:
    """A body of about size bytes that /v1/systemone refuses with a 422 echoing it about three times over
    (each question of an unknown type is reported once for each type it might have been)."""
    return json.dumps({"state": "x", "questions": {str(i): {"type": "nope", "x": "a" * 100}
                                                   for i in range(size // 130)}}).encode()


def _reset(conn) -> bool:
    """Whether the gateway reset conn (TCP_INFO's state, read without taking any of what waits unread)."""
    return conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_CLOSE


TCP_CLOSE = 7


def test_pipelined_answers_nobody_reads_are_bounded_across_connections_and_let_go(daemon):
    # Connections pipeline two bodies whose 422s echo them three times over, and read nothing. Each next
    # request was answered as soon as the one before was written, sent or not, and waited to write,
    # holding the route's memory: 12 MB a connection, without bound (200 MB for these 16). Now the next
    # request waits for the client to read, and past the bound the connections whose clients stopped
    # reading are reset, those holding the most first: the gateway holds the bound and what it answered
    # within DRAIN_GRACE_S. Twice over: what the first round held is let go when it closes, and the
    # second holds no more.
    before = rss_kb(daemon.gateway), _descriptors(daemon.gateway)
    for _ in range(2):
        peak = _pipelined_and_unread(daemon, before[0], connections=10)
        # The bound (8 MiB), what 2 s of answers hold (some 20 MB) and what answering such a body costs
        # the interpreter (some 14 MB while it is answered): some 60 MB, whatever the number of connections.
        assert peak < 96 << 10, f"the gateway grew {peak} kB"
        wait_for(lambda: _descriptors(daemon.gateway) <= before[1], 20, "the connections let go")


def _pipelined_and_unread(daemon, before_kb: int, connections: int) -> int:
    """Run the attack on the daemon's gateway; how much it grew, at most, in kB."""
    body = _echoed(MAX - (64 << 10))
    conns, peak = [], 0
    try:
        for i in range(connections):
            # each its own client (no client's share of bodies is met), one body at a time in the guard
            # (nor is the budget); the next comes once this one's answer does
            conn = _connect(daemon.port, f"127.0.0.{10 + i}", rcvbuf=4096)
            conns.append(conn)
            conn.setblocking(False)
            unsent = memoryview((_head(len(body)) + body) * 2)

            def answered() -> bool:
                nonlocal unsent, peak
                try:
                    unsent = unsent[conn.send(unsent):] if unsent else unsent
                except BlockingIOError:
                    pass
                peak = max(peak, rss_kb(daemon.gateway) - before_kb)
                return _readable(conn)

            wait_for(answered, 30, "the first request's answer")

        def reset() -> bool:
            nonlocal peak
            peak = max(peak, rss_kb(daemon.gateway) - before_kb)
            return sum(map(_reset, conns)) >= len(conns) - 2        # two answers fit in three quarters of it

        wait_for(reset, 30, "the connections whose clients stopped reading reset")
        return peak
    finally:
        for conn in conns:
            conn.close()


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_past_the_bound_clients_that_stopped_reading_are_reset_the_largest_first():
    class Connection:
        def __init__(self, holds, reading=False):
            self.holds, self.reading, self.dropped = holds, reading, False

        def held(self):
            return 0 if self.dropped else self.holds

        def reading_until(self, now):
            return now + 2 if self.reading else now

        def drop(self):
            self.dropped = True

    async def scenario():
        connections = [Connection(10), Connection(40), Connection(5), Connection(30), Connection(50, reading=True)]
        buffers = Buffers(budget=100)
        buffers.grew(90, connections)            # under the budget as counted from above: nothing counted
        assert not any(c.dropped for c in connections)
        buffers.grew(20, connections)            # over it: counted (135), and reset until 75 is held
        assert [c.holds for c in connections if c.dropped] == [40, 30]     # the reader's 50 kept
        assert buffers.counted == 65 <= 100 * BUFFER_LOW_WATER and buffers.since == 0 and buffers.again is None
        # Past it with readers alone: none reset, and counted again once one could have stopped, not on
        # each byte meanwhile.
        readers = [Connection(80, reading=True), Connection(70, reading=True)]
        buffers = Buffers(budget=100)
        buffers.grew(101, readers)
        assert not any(c.dropped for c in readers) and buffers.again is not None and buffers.counted == 150
        buffers.grew(1000, readers)
        assert buffers.since == 1000            # not counted meanwhile
        buffers.again.cancel()

    asyncio.run(scenario())


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


def test_a_request_of_exactly_the_message_limit_is_sent_and_one_byte_more_is_not():
    # The daemon's socket drops a peer that sends more than --max-message-bytes (ZMQ_MAXMSGSIZE): with the
    # gateway as that peer, one such request would cut every HTTP caller off, so the gateway counts first.
    from jevany_client.protocol import encode_request
    fits = {"state": "x" * 100}
    limit = len(encode_request(1, "decide", fits))
    assert len(encode_request(2, "decide", {"state": "x" * 101})) == limit + 1     # ids 1 and 2: one width
    upstream = Upstream("inproc://supervisor-limit", limit)
    supervisor = upstream.ctx.socket(zmq.ROUTER)
    supervisor.setsockopt(zmq.LINGER, 0)
    supervisor.bind("inproc://supervisor-limit")
    upstream.sock.close()
    upstream.sock = upstream.ctx.socket(zmq.DEALER)
    upstream.sock.setsockopt(zmq.LINGER, 0)
    upstream.sock.connect("inproc://supervisor-limit")

    async def scenario():
        upstream.start()
        try:
            sent = asyncio.ensure_future(upstream.call("decide", fits, wait_s=30))
            await asyncio.sleep(0)
            assert supervisor.poll(5000), "a request of exactly the limit was not sent"
            routing, request = supervisor.recv_multipart()
            assert len(request) == limit
            with pytest.raises(TooLarge):
                await upstream.call("decide", {"state": "x" * 101}, wait_s=2)
            assert not supervisor.poll(200), "a request over the limit was sent"
            supervisor.send_multipart([routing, msgpack.packb({"v": 1, "id": 1, "ok": True, "result": {}})])
            return await asyncio.wait_for(sent, 5)
        finally:
            supervisor.close()
            await upstream.close()

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == {}
