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

Idle keep-alive connections are closed after uvicorn's timeout_keep_alive.
A connection closed while its client may still be sending (a refused body,
an oversized header) lingers first, as Apache's lingering close does: our
side is shut for writing and what still comes is read and dropped for up to
LINGER_S, so the client reads its answer instead of a reset that discards it.
"""
import resource

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

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


def max_connections() -> int:
    return max(16, min(MAX_CONNECTIONS, int(resource.getrlimit(resource.RLIMIT_NOFILE)[0] * FD_SHARE)))


class GuardedHttp(HttpToolsProtocol):
    limit = max_connections()

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
            victim.transport.raw.close()
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
        self.transport.raw.close()

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
        self.in_headers, self.received, self.parsed, self.header_count = False, 0, 0, 0
        bulk = httptools.parse_url(self.url).path == BULK_PATH.encode()
        self._deadline(None if bulk else BODY_TIMEOUT_S)
        super().on_headers_complete()
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

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def close(self) -> None:
        self.protocol.linger()

    def write(self, data) -> None:
        # Lingering or closed, our side takes no more: an answer that comes after (a pipelined one,
        # one in flight when the connection was closed) is dropped. A write after write_eof raised,
        # and logged a 60-line traceback per connection.
        if self.protocol.lingering is None and not self.raw.is_closing():
            self.raw.write(data)

    def writelines(self, lines) -> None:
        if self.protocol.lingering is None and not self.raw.is_closing():
            self.raw.writelines(lines)

    def is_closing(self) -> bool:
        return self.protocol.lingering is not None or self.raw.is_closing()


class _Refused(Exception):
    """Raised from a parser callback to stop the parser; the refusal waits in GuardedHttp.refusal."""
