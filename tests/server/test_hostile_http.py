"""Hostile HTTP clients against one daemon's gateway: bodies that trickle or hog, and the gateway's reader of
the daemon's replies while its loop is busy.

The daemon runs with --max-message-bytes 1 MiB, so its gateway's bounds are small: 8 MiB of bodies, 4 MiB
of them for one client. Clients bound to other loopback addresses (127.0.0.2, ...) stand for other hosts.
"""
import asyncio
import json
import select
import socket
import time
from collections import Counter

import msgpack
import pytest
import zmq

from jevany_client.errors import OverloadedError
from jevany_daemon.gateway.guard import BODY_BUDGET_MESSAGES, BODY_GRACE_S, CLIENT_SHARE_MESSAGES
from jevany_daemon.gateway.upstream import Upstream

from .daemons import wait_for
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
