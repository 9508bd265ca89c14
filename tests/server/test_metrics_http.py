"""The metrics endpoint's own HTTP server: what it serves, and a newcomer past the connection cap taking the
place of the oldest connection still sending (a real server thread on loopback, real sockets)."""
import socket

import pytest
from prometheus_client import CollectorRegistry, Counter

from jevany_daemon.server.metrics_http import MAX_CONNECTIONS, MetricsServer


@pytest.fixture
def server():
    registry = CollectorRegistry()
    Counter("jevany_test_events", "A series to find in the scrape.", registry=registry).inc(3)
    metrics = MetricsServer(registry, "127.0.0.1", 0)
    try:
        yield metrics
    finally:
        metrics.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(10)        # every read below is bounded: a reply that never comes fails the test
    return sock


def ask(port: int, request: bytes) -> bytes:
    with connect(port) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def closed(sock: socket.socket) -> bool:
    """Whether the server closed sock: an end of file, or a reset where it closed with our request unread."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("request_line", [b"GET /metrics", b"GET /metrics?name[]=x", b"GET /", b"HEAD /metrics"])
def test_the_metrics_are_served_at_metrics_and_the_root_for_get_and_head(server, request_line):
    answer = ask(server.port, request_line + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"jevany_test_events_total 3.0" in answer


@pytest.mark.parametrize("request_line, status", [(b"GET /other", b"404 Not Found"),
                                                  (b"POST /metrics", b"405 Method Not Allowed")])
def test_anything_else_is_refused(server, request_line, status):
    assert ask(server.port, request_line + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 " + status)


def test_a_scrape_past_the_cap_gets_in_and_the_oldest_slow_connection_is_closed_for_it(server):
    slow = [connect(server.port) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in slow:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")      # a request begun and never finished
        assert ask(server.port, b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200 OK")
        # The eviction came before the scrape was taken in; its own expiry (REQUEST_TIMEOUT_S) would close the
        # first later anyway, so the server's connections tell which one went, not the client's end.
        held = {conn.sock.getpeername() for conn in list(server.conns.values())}
        assert slow[0].getsockname() not in held and {s.getsockname() for s in slow[1:]} <= held
        assert server.evicted == 1 and closed(slow[0])
    finally:
        for sock in slow:
            sock.close()
