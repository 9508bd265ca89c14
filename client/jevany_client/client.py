"""JevClient: one DEALER socket, pipelined requests, replies matched by id."""

import itertools
import math
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import zmq

from .endpoints import default_endpoint
from .errors import InvalidRequestError, JevanyError, JevTimeoutError, error_from_wire
from .protocol import decode_reply, encode_request
from .questions import Choice, Noul, Score, questions_to_wire
from .schema import Media

# Sends wait (within the call's timeout) once this many messages are queued
# towards the daemon, instead of growing memory without bound.
_SEND_HWM = 10_000


def decide_body(
    state: Any,
    questions: Mapping[str, Choice | Noul | Score | dict],
    model: str | None = None,
    media: Iterable[Media | dict] | None = None,
) -> dict[str, Any]:
    """The wire body of a `decide` request, as JevClient.decide_many takes it."""
    body: dict[str, Any] = {"state": state, "questions": questions_to_wire(questions)}
    if model is not None:
        body["model"] = model
    if media is not None:
        body["media"] = [_media_to_wire(item) for item in media]
    return body


def _media_to_wire(item: Media | dict) -> dict:
    if isinstance(item, Media):
        return {"type": item.type, "uri": item.uri}
    return dict(item)


class JevClient:
    """A connection to one or more jevany daemons over a single ZeroMQ DEALER socket.

    Threads: a client belongs to the thread that first uses it, because a ZeroMQ
    socket must not be shared between threads. Calling it from any other thread
    raises RuntimeError; create one client per thread (they share one ZeroMQ
    context). `close()` alone may come from another thread, once the owner is
    done with the client.

    Processes: after a fork the child transparently opens its own socket (and
    context) on first use; the parent's socket is never touched in the child.

    `endpoint` is one endpoint or a list of them; with several, ZeroMQ spreads
    requests over the daemons that are connected. `timeout` (seconds, None for
    no limit) applies to every call that does not pass its own; on expiry a
    call raises JevTimeoutError and the client stays usable, and a reply that
    arrives later is discarded rather than handed to a later call.
    """

    def __init__(
        self,
        endpoint: str | Sequence[str] | None = None,
        timeout: float | None = 30.0,
        *,
        context: zmq.Context | None = None,
    ) -> None:
        self.endpoints = _endpoint_list(endpoint)
        self.timeout = _check_timeout(timeout)
        self._context = context
        self._socket: zmq.Socket | None = None
        self._pid: int | None = None
        self._owner: int | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._new_id_space()
        self.discarded = 0  # replies dropped because no call awaited them

    def __repr__(self) -> str:
        return f"JevClient({self.endpoints!r}, timeout={self.timeout!r})"

    def __enter__(self) -> "JevClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- public operations ---------------------------------------------------

    def decide(
        self,
        state: Any,
        questions: Mapping[str, Choice | Noul | Score | dict],
        model: str | None = None,
        media: Iterable[Media | dict] | None = None,
        timeout: float | None = None,
    ) -> dict:
        """Ask one decision; returns the reply's `result` (PROTOCOL.md "decide result")."""
        body = decide_body(state, questions, model, media)
        wait = self._wait(timeout)
        return self.call("decide", body, timeout=wait, timeout_ms=_to_ms(wait))

    def decide_many(
        self,
        requests: Iterable[dict],
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list:
        """Pipeline many `decide` bodies over the one socket; results in request order.

        `timeout` bounds the whole batch. With return_exceptions, each failed
        request holds its JevanyError in place; otherwise the first failure (in
        request order) is raised once every reply is in or the time is up.
        """
        bodies = list(requests)
        wait = self._wait(timeout)
        ids = [self._next_id() for _ in bodies]
        outcomes: dict[str, Any] = {}
        sendable = []
        for rid, body in zip(ids, bodies):
            try:
                sendable.append((rid, self._encode(rid, "decide", body, _to_ms(wait))))
            except JevanyError as err:
                if not return_exceptions:
                    raise  # nothing has been sent yet
                outcomes[rid] = err
        if sendable:
            outcomes.update(self._exchange(sendable, "decide", wait))
        results = [outcomes[rid] for rid in ids]
        if not return_exceptions:
            for result in results:
                if isinstance(result, JevanyError):
                    raise result
        return results

    def ping(self, timeout: float | None = None) -> dict:
        return self.call("ping", timeout=timeout)

    def status(self, timeout: float | None = None) -> dict:
        return self.call("status", timeout=timeout)

    def models(self, timeout: float | None = None) -> dict:
        return self.call("models", timeout=timeout)

    def clear_cache(self, timeout: float | None = None) -> dict:
        """Control op: connect this client to the daemon's control endpoint."""
        return self.call("clear_cache", timeout=timeout)

    def drain(self, timeout: float | None = None) -> dict:
        """Control op: connect this client to the daemon's control endpoint."""
        return self.call("drain", timeout=timeout)

    def reload(self, timeout: float | None = None) -> dict:
        """Control op: connect this client to the daemon's control endpoint."""
        return self.call("reload", timeout=timeout)

    def call(
        self,
        op: str,
        body: dict | None = None,
        timeout: float | None = None,
        timeout_ms: int | None = None,
    ) -> dict:
        """Send any op and return its result; an error reply raises its typed JevanyError.

        `timeout` is how long this client waits (None: the client's default);
        `timeout_ms` is sent to the daemon, which then answers
        deadline_exceeded rather than score a request that waited longer.
        """
        rid = self._next_id()
        payload = self._encode(rid, op, body, timeout_ms)
        outcome = self._exchange([(rid, payload)], op, self._wait(timeout))[rid]
        if isinstance(outcome, JevanyError):
            raise outcome
        return outcome

    def close(self) -> None:
        self._closed = True
        sock, self._socket = self._socket, None
        if sock is not None and self._pid == os.getpid():
            sock.close(linger=0)

    # -- the socket ------------------------------------------------------------

    def _socket_for_caller(self) -> zmq.Socket:
        if self._closed:
            raise RuntimeError("this JevClient is closed")
        pid = os.getpid()
        if self._pid != pid:
            if self._pid is not None:
                # Forked: a parent thread may have held the lock, and it is gone here.
                self._lock = threading.Lock()
            with self._lock:
                if self._pid != pid:
                    self._open(pid)
        if threading.get_ident() != self._owner:
            raise RuntimeError(
                "this JevClient belongs to another thread; ZeroMQ sockets cannot be shared "
                "between threads, so create one JevClient per thread"
            )
        return self._socket

    def _open(self, pid: int) -> None:
        forked = self._pid is not None
        if forked:
            # The inherited socket and context belong to the parent's I/O thread,
            # which does not exist here: drop them without closing anything.
            self._socket = None
            self._context = None
            self._new_id_space()
        context = zmq.Context.instance() if self._context is None else self._context
        self._socket = _connect(context, self.endpoints)
        self._context = context
        self._pid = pid
        self._owner = threading.get_ident()

    def _new_id_space(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._counter = itertools.count(1)

    def _next_id(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"

    def _wait(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else _check_timeout(timeout)

    def _encode(self, rid: str, op: str, body: dict | None, timeout_ms: int | None) -> bytes:
        try:
            return encode_request(rid, op, body, timeout_ms)
        except (TypeError, ValueError, OverflowError) as exc:
            # msgpack's own errors for values it cannot carry (sets, huge ints, bad text).
            raise InvalidRequestError(f"{op} body cannot be sent: {exc}", request_id=rid) from exc

    def _exchange(
        self, requests: list[tuple[str, bytes]], op: str, wait: float | None
    ) -> dict[str, Any]:
        sock = self._socket_for_caller()
        exchange = _Exchange(requests)
        deadline = None if wait is None else time.monotonic() + wait
        exchange.send_ready(sock)
        while exchange.awaited:
            poll_ms = _poll_ms(deadline)
            if poll_ms == 0:
                break
            flags = zmq.POLLIN | (zmq.POLLOUT if exchange.unsent else 0)
            events = sock.poll(poll_ms, flags)
            if events & zmq.POLLOUT:
                exchange.send_ready(sock)
            if events & zmq.POLLIN:
                exchange.receive_ready(sock)
        self.discarded += exchange.discarded
        exchange.time_out(op, ", ".join(self.endpoints), wait)
        return exchange.outcomes


class _Exchange:
    """One call's requests: which are unsent, which await a reply, what came back."""

    def __init__(self, requests: list[tuple[str, bytes]]) -> None:
        self.unsent = deque(requests)
        self.awaited = {rid for rid, _ in requests}
        self.outcomes: dict[str, Any] = {}
        self.discarded = 0
        self.unattributed: JevanyError | None = None

    def send_ready(self, sock: zmq.Socket) -> None:
        while self.unsent:
            try:
                sock.send(self.unsent[0][1], zmq.NOBLOCK)
            except zmq.Again:
                return  # no daemon connected yet, or the send queue is full
            self.unsent.popleft()

    def receive_ready(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.take(frames[-1])

    def take(self, payload: bytes) -> None:
        try:
            reply = decode_reply(payload)
        except JevanyError as err:
            self._settle(err.request_id, err)
            return
        rid = reply["id"]
        if reply["ok"]:
            self._settle(rid, reply["result"])
        else:
            self._settle(rid, error_from_wire(reply["error"], request_id=rid))

    def _settle(self, rid: str | int | None, outcome: Any) -> None:
        if rid in self.awaited:
            self.awaited.remove(rid)
            self.outcomes[rid] = outcome
            return
        # A late reply to a call that already timed out, or one the daemon could
        # not tie to an id: never hand it to a request it does not belong to.
        self.discarded += 1
        if rid is None and isinstance(outcome, JevanyError):
            self.unattributed = outcome

    def time_out(self, op: str, where: str, wait: float | None) -> None:
        unsent = {rid for rid, _ in self.unsent}
        for rid in self.awaited:
            sent = rid not in unsent
            self.outcomes[rid] = JevTimeoutError(
                self._timeout_message(op, where, wait, sent), request_id=rid, sent=sent
            )

    def _timeout_message(self, op: str, where: str, wait: float | None, sent: bool) -> str:
        if not sent:
            return (
                f"daemon not reachable at {where} within {wait:g}s; the {op} request was not sent"
            )
        message = f"no reply to {op} from {where} within {wait:g}s"
        if self.unattributed is not None:
            err = self.unattributed
            message += f" (a reply without a usable id also came: {err.code}: {err.message})"
        return message


def _connect(context: zmq.Context, endpoints: list[str]) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    # Queue requests only on completed connections: a daemon that is down then
    # holds none of them, and with several endpoints the live ones take the load.
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.SNDHWM, _SEND_HWM)
    # Replies are bounded by the requests this client sent; a receive limit would
    # only make the daemon's ROUTER drop replies silently.
    sock.setsockopt(zmq.RCVHWM, 0)
    for endpoint in endpoints:
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ValueError(f"cannot connect to {endpoint!r}: {exc}") from exc
    return sock


def _endpoint_list(endpoint: str | Sequence[str] | None) -> list[str]:
    if endpoint is None:
        return [default_endpoint()]
    endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
    if not endpoints or not all(isinstance(e, str) and e for e in endpoints):
        raise ValueError(f"endpoint must be a non-empty str or list of them, got {endpoint!r}")
    return endpoints


def _check_timeout(timeout: float | None) -> float | None:
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if timeout is not None and not (number and 0 < timeout < math.inf):
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    return timeout


def _to_ms(wait: float | None) -> int | None:
    return None if wait is None else math.ceil(wait * 1000)


def _poll_ms(deadline: float | None) -> int | None:
    if deadline is None:
        return None
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))
