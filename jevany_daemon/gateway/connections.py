"""HTTP connections the gateway will hold: few enough, briefly enough, with headers of a bounded size.

uvicorn's httptools protocol (the fast parser the gateway runs) bounds none
of this: a connection may stay open sending nothing, send its headers a byte
at a time, or send a 150 MB header, which the parser gathers (at a cost that
grows with its square) before anything can refuse it. 1,100 idle connections
under a 1,024-descriptor limit made every HTTP request fail; 3,000 slowloris
connections were all kept. This protocol adds, per connection:

- headers (request line included) within MAX_HEADER_BYTES and
  MAX_HEADER_COUNT, refused with 431 as soon as they pass it, before the
  parser has gathered more;
- the headers whole within HEADER_TIMEOUT_S of their first byte, and the
  body within BODY_TIMEOUT_S of its headers, else the connection is closed
  (but a bulk body, read as its answers go out: it may take as long as its
  items do, and the route itself ends one that stalls while it waits on it);
- at most MAX_PIPELINED requests queued behind the one being answered (a
  client that pipelines faster than it reads is closed: uvicorn parses each
  read whole, so its queue grew by thousands a read);
- at most max_connections at once (a share of the descriptor limit): a
  newcomer past that closes the connection idle longest (between requests,
  or still sending its headers); when every one is busy with a request, the
  newcomer gets 503 and is closed. So a flood of idle connections costs its
  sender its own connections, not everyone's.

And across connections, one bound on what they buffer outside the routes
(Buffers): requests read but not yet handled (queued behind the one being
answered, or a body the route has not taken yet) and answers written but
not yet sent (the event loop keeps what the kernel will not take, without
limit: a 1 MB body refused with a 422 that echoes it thrice is a 3 MB
answer, and a client that reads nothing leaves it there as long as it keeps
the connection open). A pipelined request is handled only once its client
has read the answer before it, so such a client holds one answer, never the
next request's work too. Past BUFFER_BUDGET_MESSAGES bodies of
--max-message-bytes, the connections whose clients have stopped reading
(nothing drained for DRAIN_GRACE_S, their kernel queue full too) are reset,
those holding the most first, what they held dropped, until the connections
hold BUFFER_LOW_WATER of it: a client that reads keeps its connection,
however large its answer, as long as it does not stop for DRAIN_GRACE_S
while the gateway is past its budget.

Idle keep-alive connections are closed after uvicorn's timeout_keep_alive.
A connection closed while its client may still be sending (a refused body,
an oversized header) lingers first, as Apache's lingering close does: our
side is shut for writing and what still comes is read and dropped for up to
LINGER_S, so the client reads its answer instead of a reset that discards it.
Then, as for a connection past its deadline or closed to make room, what it
has not read is dropped: asyncio's close() waits until it is sent, which for
a client that reads nothing is never.
"""
import array
import asyncio
import fcntl
import logging
import resource
import socket
import struct
import termios
import time

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from jevany_daemon.logs import RateLimited

from .paths import BULK_PATH

MAX_HEADER_BYTES = 64 << 10
MAX_HEADER_COUNT = 100
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0
LINGER_S = 2.0
LINGER_BYTES = 16 << 20   # dropped while lingering, at most
MAX_CONNECTIONS = 4096
MAX_PIPELINED = 32        # requests queued behind the one being answered, per connection; then it is closed
CLOSE = (0, "")           # the refusal that sends nothing: the connection is closed
FD_SHARE = 0.5            # of the descriptor limit, the most connections may take
BUFFER_BUDGET_MESSAGES = 8      # bodies of --max-message-bytes every connection's buffers may hold together
BUFFER_LOW_WATER = 0.75         # of that budget, what they may hold once those past it are reset
DRAIN_GRACE_S = 2.0             # a client whose answers have not drained for this long has stopped reading
DRAINING_BELOW = 64 << 10       # a kernel send queue under this is being read
DROPPED_LOG_EVERY_S = 10.0
log = logging.getLogger("jevany.gateway")


def max_connections() -> int:
    return max(16, min(MAX_CONNECTIONS, int(resource.getrlimit(resource.RLIMIT_NOFILE)[0] * FD_SHARE)))


class Buffers:
    """The bytes every connection holds outside the routes, bounded together (see the module's docstring).

    Counted from above, cheaply: each byte read or written adds to what was held at the last exact
    count, and only when that passes the budget is each connection's hold counted exactly (a scan of
    them all, once per budget's worth of traffic at most while they hold little). Past the budget
    with no client that stopped reading to reset (large answers on their way to clients that read),
    it is counted again when the first of them could be found to have stopped, and not before.
    """

    def __init__(self, budget: int):
        self.budget = budget
        self.counted = 0        # what the connections held at the last exact count
        self.since = 0          # bytes read or written since: they hold at most counted + since
        self.dropped = 0        # connections reset for holding the most
        self.again = None       # the count to come, while the budget is passed by clients that read
        self.warned = RateLimited(log, "http_buffers_full", DROPPED_LOG_EVERY_S, time.monotonic,
                                  level=logging.WARNING)

    def grew(self, size: int, connections) -> None:
        self.since += size
        if self.counted + self.since > self.budget and self.again is None:
            self.settle(connections)

    def settle(self, connections) -> int:
        """Count exactly; past the budget, reset the connections whose clients stopped reading, those
        holding the most first, until BUFFER_LOW_WATER of it is held; if the rest still pass it, count
        again when the first of them could be found to have stopped."""
        loop = asyncio.get_running_loop()
        self.again = None
        held = {c: c.held() for c in connections}
        total = sum(held.values())
        if total > self.budget:
            before, closed, now, first = total, 0, loop.time(), None
            for connection in sorted(held, key=held.__getitem__, reverse=True):
                if total <= self.budget * BUFFER_LOW_WATER or not held[connection]:
                    break
                until = connection.reading_until(now)
                if until <= now:
                    total -= held[connection]
                    connection.drop()
                    closed += 1
                elif first is None or until < first:
                    first = until
            self.dropped += closed
            self.warned.hit(held_bytes=before, budget_bytes=self.budget, closed=closed, closed_in_all=self.dropped)
            if total > self.budget and first is not None:
                self.again = loop.call_at(first, self.settle, connections)
        self.counted, self.since = total, 0
        return total


class GuardedHttp(HttpToolsProtocol):
    limit = max_connections()
    buffers: Buffers      # every connection's, together: the gateway sets them (process.py) before it serves

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last_active = self.loop.time()
        self.in_headers = True         # between requests, the next bytes are a request line and headers
        self.received = 0              # bytes in since this request's headers began
        self.parsed = 0                # of which the parser has delivered (request line, headers)
        self.header_count = 0
        self.refusal: tuple[int, str] | None = None
        self.deadline_task = None
        self.lingering: int | None = None     # bytes dropped since the close began; None: not closing
        self.dropped = False                  # closed for holding the most of every connection's buffers
        self.handing = 0                      # answer bytes its requests handed over, not yet written
        self.next_waits = False               # a queued request waits for the client to read an answer
        self.drained_at = self.loop.time()    # when its answers were last seen draining

    # --- the connection's life --------------------------------------------

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.transport = _Lingering(transport, self)     # what uvicorn and its request cycles close
        self._deadline(HEADER_TIMEOUT_S)
        if len(self.connections) > self.limit:
            self._make_room()

    def connection_lost(self, exc) -> None:
        self._deadline(None)
        super().connection_lost(exc)

    def _make_room(self) -> None:
        idle = [c for c in self.connections if c is not self and c.idle_or_lingering()]
        if idle:
            victim = min(idle, key=lambda c: c.last_active)
            victim.transport.raw.abort()
        else:
            self._refuse(503, "the gateway is at its connection limit; retry later")

    def idle(self) -> bool:
        """Between requests, or still sending its headers: closing it loses no request in hand."""
        return self.in_headers and (self.cycle is None or self.cycle.response_complete)

    def _deadline(self, seconds: float | None) -> None:
        if self.deadline_task is not None:
            self.deadline_task.cancel()
            self.deadline_task = None
        if seconds is not None:
            self.deadline_task = self.loop.call_later(seconds, self._too_slow)

    def _too_slow(self) -> None:
        self.deadline_task = None
        self.transport.raw.abort()

    def held(self) -> int:
        """What this connection buffers outside the routes: answers handed over or written but not yet
        sent, requests read but not yet handled (the headers and body of each queued one, the body the
        route has not taken yet)."""
        if self.dropped:
            return 0
        queued = sum(getattr(cycle, "head_bytes", 0) + len(cycle.body) for cycle, _ in self.pipeline)
        current = len(self.cycle.body) if self.cycle is not None and not self.pipeline else 0
        return self.transport.unsent() + self.handing + queued + current

    def reading_until(self, now: float) -> float:
        """Until when its client is taken to be reading: DRAIN_GRACE_S after its answers last drained
        (the kernel's queue to it seen emptied counts: a client that reads empties it even while the
        loop is too busy to hand it more); a time not after now says it has stopped."""
        sock = self.transport.raw.get_extra_info("socket")
        queued = array.array("i", [0])
        try:
            fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, queued, True)
        except (AttributeError, OSError):
            return now
        if queued[0] < DRAINING_BELOW:
            self.drained_at = now
        return self.drained_at + DRAIN_GRACE_S

    def drop(self) -> None:
        """Close at once with a reset, what it holds let go: unsent answers (the kernel's copy too, which
        a client that reads nothing would keep there), queued requests, an answer waiting to be written."""
        self.dropped = True
        self._deadline(None)
        try:
            self.transport.raw.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                                   struct.pack("ii", 1, 0))
        except (AttributeError, OSError):
            pass            # closed already: nothing left to reset
        self.transport.raw.abort()

    def _counted(self, send):
        """A request's send, the body it is handed counted in held() until it is written: uvicorn waits
        there, the body in hand, while the client reads nothing."""
        async def counted(message) -> None:
            size = len(message.get("body", b"")) if message["type"] == "http.response.body" else 0
            if not size:
                return await send(message)
            self.handing += size
            self.buffers.grew(size, self.connections)
            try:
                await send(message)
            finally:
                self.handing -= size
        return counted

    def linger(self) -> None:
        """Close once the client has read what was sent: shut our side, drop what still comes, then go."""
        raw = self.transport.raw
        if self.lingering is not None or raw.is_closing():
            return
        self.lingering = 0
        if raw.can_write_eof():
            raw.write_eof()
        self.flow.resume_reading()
        self._deadline(LINGER_S)

    # --- bytes in ------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.lingering is not None:
            self.lingering += len(data)
            if self.lingering > LINGER_BYTES:
                self.transport.raw.close()
            return
        self.last_active = self.loop.time()
        self._unset_keepalive_if_required()
        if self.in_headers:
            if self.received == 0 and self.deadline_task is None:
                self._deadline(HEADER_TIMEOUT_S)      # the next request on a kept-alive connection
            self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if self.refusal is CLOSE:
                self.transport.raw.close()        # the answers it already has stay; nothing more is read
            elif self.refusal is not None:
                self._refuse(*self.refusal)
            else:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return
        # A header still arriving is gathered by the parser, unseen until it ends: refuse it on what came.
        if self.in_headers and self.received > MAX_HEADER_BYTES:
            self._refuse(431, f"request headers exceed {MAX_HEADER_BYTES} bytes")
        self.buffers.grew(len(data), self.connections)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.in_headers = True

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        self._count(len(name) + len(value) + 4)
        if self.header_count > MAX_HEADER_COUNT:
            self.refusal = (431, f"requests may carry at most {MAX_HEADER_COUNT} headers")
            raise _Refused()
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        # Headers that arrived in one read are delivered whole, within that read: bound them here.
        self.parsed += size
        if self.parsed > MAX_HEADER_BYTES:
            self.refusal = (431, f"request headers exceed {MAX_HEADER_BYTES} bytes")
            raise _Refused()

    def on_headers_complete(self) -> None:
        head = self.parsed
        self.in_headers, self.received, self.parsed, self.header_count = False, 0, 0, 0
        bulk = httptools.parse_url(self.url).path == BULK_PATH.encode()
        self._deadline(None if bulk else BODY_TIMEOUT_S)
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:            # a request (an upgrade makes none)
            self.cycle.head_bytes = head        # what it holds while queued (held())
            self.cycle.send = self._counted(self.cycle.send)
        if len(self.pipeline) > MAX_PIPELINED:
            # A client that sends requests faster than it reads their answers: each read it sends is
            # parsed whole, so its queue grew by thousands a read (0.7 GB in 12 s) without this bound.
            self.pipeline.clear()
            self.refusal = CLOSE
            raise _Refused()

    def on_message_complete(self) -> None:
        self._deadline(None)
        self.in_headers = True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # uvicorn starts the next pipelined request as soon as an answer is written, sent or not: a
        # client that pipelines and reads nothing had each next request parsed, answered and held,
        # the route's memory with it (23 MB a connection for a 1 MB body refused with a 422 that
        # echoes it), while it waited to write. The next one waits for the client to read instead.
        if self.pipeline and self.flow.write_paused and not self.transport.is_closing():
            self.next_waits = True
            return
        super().on_response_complete()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.drained_at = self.loop.time()
        if self.next_waits:
            self.next_waits = False
            super().on_response_complete()

    def idle_or_lingering(self) -> bool:
        return self.lingering is not None or self.idle()

    def _refuse(self, status: int, message: str) -> None:
        if self.transport.is_closing():
            return
        body = message.encode()
        self.transport.write(b"".join([
            STATUS_LINE[status], b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]))
        self.transport.close()


class _Lingering:
    """The connection's transport as uvicorn sees it: close() lingers (GuardedHttp.linger)."""

    def __init__(self, raw, protocol: GuardedHttp):
        self.raw, self.protocol = raw, protocol
        self.written = 0      # bytes written since the transport last had nothing left to send

    def unsent(self) -> int:
        """What the answers not yet sent hold: the writes since the transport last had nothing to send,
        whole, as uvloop keeps each (asyncio keeps the part not sent, less)."""
        if not self.raw.get_write_buffer_size():
            self.written = 0
        return self.written

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def close(self) -> None:
        self.protocol.linger()

    def write(self, data) -> None:
        # Lingering or closed, our side takes no more: an answer that comes after (a pipelined one,
        # one in flight when the connection was closed) is dropped. A write after write_eof raised,
        # and logged a 60-line traceback per connection.
        if self.protocol.lingering is None and not self.raw.is_closing():
            self._wrote(len(data))
            self.raw.write(data)
            self.protocol.buffers.grew(len(data), self.protocol.connections)

    def writelines(self, lines) -> None:
        if self.protocol.lingering is None and not self.raw.is_closing():
            lines = list(lines)
            size = sum(map(len, lines))
            self._wrote(size)
            self.raw.writelines(lines)
            self.protocol.buffers.grew(size, self.protocol.connections)

    def _wrote(self, size: int) -> None:
        if self.raw.get_write_buffer_size():
            self.written += size
        else:
            self.written = size
            self.protocol.drained_at = self.protocol.loop.time()    # all sent before this

    def is_closing(self) -> bool:
        return self.protocol.lingering is not None or self.raw.is_closing()


class _Refused(Exception):
    """Raised from a parser callback to stop the parser; the refusal waits in GuardedHttp.refusal."""
