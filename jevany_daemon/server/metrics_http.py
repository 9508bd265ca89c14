"""The metrics endpoint's HTTP server: one thread, one selector, few connections, each with a deadline.

prometheus_client's own server starts a thread for every connection and
waits on each for ever: 1,050 connections that never finished a request held
1,050 threads and descriptors in the supervisor, which then had none left for
its clients. Here:

- at most MAX_CONNECTIONS at once; a newcomer past that takes the place of
  the oldest connection still sending its request, so a scraper always gets
  in however many slow ones an attacker opens;
- a request must arrive whole (at most MAX_REQUEST_BYTES) within
  REQUEST_TIMEOUT_S, and its answer leave within WRITE_TIMEOUT_S;
- one request per connection, then it is closed: scrapers ask every few
  seconds, and a held connection is a descriptor.

Only GET /metrics (and /) are served, rendered by prometheus_client from the
registry the supervisor updates; its metrics take their own locks.
"""
import errno
import selectors
import socket
import threading
import time

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

MAX_CONNECTIONS = 32
MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
ACCEPT_PAUSE_S = 0.1     # after running out of descriptors: try again then, not in a busy loop
TICK_S = 0.5
BACKLOG = 1024           # connections the kernel holds while the thread gets round to them (they cost it, not us)


class _Conn:
    __slots__ = ("sock", "opened", "deadline", "request", "reply")

    def __init__(self, sock: socket.socket, now: float):
        self.sock, self.opened, self.deadline = sock, now, now + REQUEST_TIMEOUT_S
        self.request = bytearray()
        self.reply: memoryview | None = None


class MetricsServer:
    def __init__(self, registry, host: str, port: int, clock=time.monotonic):
        self.registry, self.clock = registry, clock
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self.selector.register(self._wake_r, selectors.EVENT_READ)
        self.conns: dict[socket.socket, _Conn] = {}
        self.evicted = self.timed_out = 0
        self._accept_again: float | None = None
        self._stopping = False
        self.thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._stopping = True
        self._wake_w.send(b"x")
        self.thread.join(5)
        for conn in list(self.conns.values()):
            self._drop(conn)
        self.selector.close()
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # --- the thread's loop ---------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            for key, events in self.selector.select(self._timeout()):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj is not self._wake_r:
                    conn = self.conns.get(key.fileobj)
                    if conn is not None:
                        self._write(conn) if events & selectors.EVENT_WRITE else self._read(conn)
            self._expire()

    def _timeout(self) -> float:
        soonest = min((c.deadline for c in self.conns.values()), default=self.clock() + TICK_S)
        if self._accept_again is not None:
            soonest = min(soonest, self._accept_again)
        return max(0.0, min(TICK_S, soonest - self.clock()))

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.selector.unregister(self.listener)     # wait in the backlog; look again shortly
                    self._accept_again = self.clock() + ACCEPT_PAUSE_S
                return
            sock.setblocking(False)
            if len(self.conns) >= MAX_CONNECTIONS:
                self._evict()
            conn = _Conn(sock, self.clock())
            self.conns[sock] = conn
            self.selector.register(sock, selectors.EVENT_READ)

    def _evict(self) -> None:
        # The oldest still sending its request first: a slow or idle one, never a fast scrape.
        reading = [c for c in self.conns.values() if c.reply is None]
        victim = min(reading or self.conns.values(), key=lambda c: c.opened)
        self.evicted += 1
        self._drop(victim)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.request += data
        end = conn.request.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.request) > MAX_REQUEST_BYTES:
                self._answer(conn, 431, b"text/plain", b"request header too large\n")
            return
        self._answer(conn, *self._respond(bytes(conn.request[:end])))

    def _respond(self, head: bytes) -> tuple[int, bytes, bytes]:
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
            return 405, b"text/plain", b"only GET /metrics is served\n"
        if parts[1].split(b"?", 1)[0] not in (b"/metrics", b"/"):
            return 404, b"text/plain", b"not found; the metrics are at /metrics\n"
        return 200, CONTENT_TYPE_LATEST.encode(), generate_latest(self.registry)

    def _answer(self, conn: _Conn, status: int, kind: bytes, body: bytes) -> None:
        reason = {200: b"OK", 404: b"Not Found", 405: b"Method Not Allowed", 431: b"Request Header Fields Too Large"}
        head = (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % (status, reason[status], kind, len(body)))
        conn.reply = memoryview(head + body)
        conn.deadline = self.clock() + WRITE_TIMEOUT_S
        self.selector.modify(conn.sock, selectors.EVENT_WRITE)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.reply)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        conn.reply = conn.reply[sent:]
        if not len(conn.reply):
            self._drop(conn)

    def _expire(self) -> None:
        now = self.clock()
        for conn in [c for c in self.conns.values() if now >= c.deadline]:
            self.timed_out += 1
            self._drop(conn)
        if self._accept_again is not None and now >= self._accept_again:
            self._accept_again = None
            self.selector.register(self.listener, selectors.EVENT_READ)

    def _drop(self, conn: _Conn) -> None:
        self.conns.pop(conn.sock, None)
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
