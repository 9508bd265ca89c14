"""The gateway's one connection to the supervisor: a DEALER carrying every HTTP request.

Requests are protocol-v1 messages with the gateway's own ids; replies are
matched to the waiting requests by id. However many HTTP requests are in
flight, over however many keep-alive connections, they share this socket:
no process or thread per request.

The socket is read straight from the event loop (its file descriptor in
add_reader, drained without blocking) rather than through zmq.asyncio's
per-call futures: that hop is on every HTTP request's path, and measured
a few hundred microseconds cheaper this way. ZeroMQ's descriptor signals
edges, so it is drained to empty on every wake-up and after every send,
a refused one too: a send takes in the socket's pending commands, the
edge of a reply that came while the loop was busy among them.
"""
import asyncio
from itertools import count

import msgpack
import zmq

from jevany_client.calls import has_message
from jevany_client.errors import InvalidRequestError, JevTimeoutError, OverloadedError, error_from_wire
from jevany_client.protocol import encode_request

from jevany_daemon import withdrawals


class Upstream:
    def __init__(self, endpoint: str, max_message_bytes: int, tenant: bytes | None = None):
        self.endpoint = endpoint
        # Sent before each request, as one routing frame the supervisor reads as the caller's
        # prefix-cache tenant (tenants.py): the token's salt, never the token.
        self.prefix = [tenant] if tenant else []
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.max_message_bytes = max_message_bytes
        self._ids = count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.getsockopt(zmq.FD), self._drain)

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
        self.sock.close()
        self.ctx.term()

    async def call(self, op: str, body: dict | None = None, timeout_ms: int | None = None,
                   wait_s: float = 30.0) -> dict:
        """The op's result; the daemon's typed error raised; JevTimeoutError after wait_s."""
        rid = next(self._ids)
        try:
            payload = encode_request(rid, op, body, timeout_ms)
        except (OverflowError, ValueError, TypeError) as exc:   # e.g. an integer wider than 64 bits
            raise InvalidRequestError(f"the body cannot be sent: {exc}") from None
        if len(payload) > self.max_message_bytes:
            raise TooLarge(len(payload), self.max_message_bytes)
        future = self._loop.create_future()
        self._waiting[rid] = future
        try:
            try:
                self.sock.send_multipart([*self.prefix, payload], zmq.NOBLOCK)
            except zmq.Again:     # the pipe to the supervisor is full: it is far behind
                raise OverloadedError("the HTTP gateway's queue to the daemon is full; retry later") from None
            finally:
                # A send, refused or not, takes in the socket's pending commands, and with them the edge
                # that said a reply had come: read what came, which no new edge announces.
                self._drain()
            reply = await asyncio.wait_for(future, wait_s)
        except asyncio.TimeoutError:
            raise JevTimeoutError(f"no reply from the daemon within {wait_s:g}s") from None
        except asyncio.CancelledError:
            # Its caller has gone (the route stopped waiting): a request still queued costs no work.
            # (wait_for cancels the future it waited on; one with a result was answered already.)
            if op == "decide" and (future.cancelled() or not future.done()):
                self._withdraw(rid)
            raise
        finally:
            self._waiting.pop(rid, None)
        if reply.get("ok"):
            return reply["result"]
        raise error_from_wire(reply.get("error"))

    def _withdraw(self, rid: int) -> None:
        try:
            self.sock.send_multipart([*self.prefix, withdrawals.encode(rid)], zmq.NOBLOCK)
        except zmq.ZMQError:    # the pipe is full or the socket closing: the request is scored, as before
            pass
        self._drain()

    def _drain(self) -> None:
        while has_message(self.sock):
            try:
                payload = self.sock.recv_multipart(zmq.NOBLOCK)[-1]    # after the tenant frame echoed back
            except zmq.Again:
                return
            # The supervisor is ours and already checked what it sends; the gateway only routes it.
            try:
                reply = msgpack.unpackb(payload, raw=False)
            except ValueError:
                continue
            future = self._waiting.get(reply.get("id")) if isinstance(reply, dict) else None
            if future is not None and not future.done():
                future.set_result(reply)


class TooLarge(Exception):
    """A request bigger than the daemon's --max-message-bytes, found before it is sent."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"the request is {size:,} bytes as a protocol message; the daemon accepts at most "
                         f"{limit:,} (its --max-message-bytes, JEVANY_MAX_MESSAGE_BYTES)")
