"""What connections may hold (gateway/connections.py): the buffers' budget, the connection limit and the body's
deadline, in process (the last two through a real uvicorn on loopback, serving with GuardedHttp)."""
import asyncio
import http.client
import resource
import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

from jevany_daemon.gateway import connections
from jevany_daemon.gateway.connections import (BUFFER_LOW_WATER, FD_SHARE, MAX_CONNECTIONS, MAX_HEADER_COUNT, Buffers,
                                               GuardedHttp)
from jevany_daemon.gateway.paths import BULK_PATH

from .daemons import wait_for


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


async def _length_of_body(scope, receive, send) -> None:
    """Reads the whole body, then answers its length."""
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    answer = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


@contextmanager
def _guarded(monkeypatch, limit: int = 64, app=None):
    """A uvicorn serving app (_length_of_body) with the gateway's protocol and `limit` connections, in a thread;
    yields its port."""
    monkeypatch.setattr(GuardedHttp, "limit", limit)
    monkeypatch.setattr(GuardedHttp, "buffers", Buffers(1 << 30), raising=False)
    listener = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app or _length_of_body, http=GuardedHttp, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), 30, "uvicorn serving")
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        listener.close()


def _get(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/")
    response = conn.getresponse()
    response.read()
    return response.status


def _status(conn: http.client.HTTPConnection) -> int:
    """The answer's status; 0 when the gateway had closed the connection."""
    try:
        return _get(conn)
    except ConnectionError:
        return 0


def test_exactly_the_limit_of_connections_are_all_kept_and_one_more_closes_an_idle_one(monkeypatch):
    with _guarded(monkeypatch, limit=3) as port:
        kept = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(3)]
        newcomer = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            # Each answered before the next connects: the gateway has taken every one of them.
            assert [_get(conn) for conn in kept] == [200] * 3
            assert [_get(conn) for conn in kept] == [200] * 3          # the limit reached, nobody closed
            assert _get(newcomer) == 200
            # One of them made room: the one idle longest, though on uvloop's clock (milliseconds) they may tie.
            assert sorted(_status(conn) for conn in kept) == [0, 200, 200]             # 0: closed
        finally:
            for conn in [*kept, newcomer]:
                conn.close()


class _Peer:
    """A connection as _make_room sees it: idle or busy, when it was last active, and whether it was aborted."""

    def __init__(self, last_active: float, idle: bool = True):
        self.last_active, self.is_idle, self.aborted = last_active, idle, False
        self.transport = self.raw = self

    def idle_or_lingering(self) -> bool:
        return self.is_idle

    def abort(self) -> None:
        self.aborted = True


def test_past_the_limit_the_connection_idle_longest_is_closed_and_the_more_recent_ones_stay():
    # The test above goes through real connections, whose last_active may tie on the loop's clock; here the
    # times are set, so closing the most recently active idle connection instead would show.
    newcomer, busy = _Peer(9.0), _Peer(1.0, idle=False)
    oldest, recent, middle = _Peer(2.0), _Peer(8.0), _Peer(5.0)
    newcomer.connections = [busy, recent, oldest, middle, newcomer]
    GuardedHttp._make_room(newcomer)
    assert [p.aborted for p in (oldest, recent, middle, busy, newcomer)] == [True, False, False, False, False]


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (rather than leaving it waiting until the socket's timeout)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_body_that_stalls_past_its_deadline_is_closed_but_a_bulk_body_may_take_longer(monkeypatch):
    monkeypatch.setattr(connections, "BODY_TIMEOUT_S", 0.5)
    with _guarded(monkeypatch) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stalled:
            stalled.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n12345")
            assert _closed(stalled)
        # A bulk body is read as its answers go out, as long as its items take: only the route ends one that
        # stalls. The pause below is what is tested (longer than BODY_TIMEOUT_S), not a wait for anything.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as bulk:
            bulk.sendall(b"POST " + BULK_PATH.encode() + b" HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
                         b"\r\n5\r\n12345\r\n")
            time.sleep(1.0)
            bulk.sendall(b"5\r\n67890\r\n0\r\n\r\n")
            response = http.client.HTTPResponse(bulk)
            response.begin()
            assert (response.status, response.read()) == (200, b"10")


async def _slow_route(scope, receive, send):
    """Reads its body, then works longer than a body may stall (BODY_TIMEOUT_S, 0.5 s below) before answering."""
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await asyncio.sleep(1.0)       # the route's work: what is tested, not a wait for anything
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_route_may_take_longer_than_a_body_may_stall_once_its_body_is_read(monkeypatch):
    # The body's deadline ends with the body: a decide queued behind others is not cut off mid-wait.
    monkeypatch.setattr(connections, "BODY_TIMEOUT_S", 0.5)
    with _guarded(monkeypatch, app=_slow_route) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("POST", "/", body=b"{}")
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, b"ok")
        finally:
            conn.close()


def test_a_request_with_exactly_the_header_cap_is_served_and_one_header_more_gets_431(monkeypatch):
    # The cap is a count a client may reach (Host is one of the headers), not one it must stay under.
    def status_of(headers: int) -> int:
        extra = b"".join(b"X-%d: 1\r\n" % i for i in range(headers - 1))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n" + extra + b"\r\n")
            response = http.client.HTTPResponse(conn)
            response.begin()
            response.read()
            return response.status

    with _guarded(monkeypatch) as port:
        assert [status_of(n) for n in (MAX_HEADER_COUNT, MAX_HEADER_COUNT + 1)] == [200, 431]


def test_a_refused_connection_lingers_for_linger_s_then_goes_though_its_client_keeps_sending(monkeypatch):
    # LINGER_S, not the header deadline (made long here), ends a refused connection whose client goes on sending.
    monkeypatch.setattr(connections, "LINGER_S", 0.3)
    monkeypatch.setattr(connections, "HEADER_TIMEOUT_S", 30.0)
    with _guarded(monkeypatch) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            extra = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADER_COUNT))
            conn.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n" + extra + b"\r\n")
            response = http.client.HTTPResponse(conn)
            response.begin()
            response.read()
            assert response.status == 431
            started, gone = time.monotonic(), None
            while gone is None and time.monotonic() - started < 5:
                try:
                    conn.sendall(b"x" * 100)        # the client's own pace: what is tested, not a wait for anything
                    time.sleep(0.05)
                except (ConnectionResetError, BrokenPipeError):
                    gone = time.monotonic() - started
            assert gone is not None and gone < 3, gone

