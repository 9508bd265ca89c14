"""JevClient: one DEALER socket, pipelined requests, replies matched by id."""

import itertools
import math
import os
import random
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import zmq

from .endpoints import default_endpoint, ipc_path
from .errors import InvalidRequestError, JevanyError, JevTimeoutError, JevUnreachableError, error_from_wire
from .protocol import decode_reply, encode_request
from .questions import Choice, Image, Noul, Score, Video, questions_to_wire
from .schema import Media

# Sends wait (within the call's timeout) once this many messages are queued
# towards the daemon, instead of growing memory without bound.
_SEND_HWM = 10_000

# Ops that change nothing on the daemon, so sending one again is harmless.
_IDEMPOTENT = frozenset({"decide", "ping", "status", "models"})
# A message this big is first checked against the daemon's own size limit.
_LARGE_MESSAGE_BYTES = 64 << 10
_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 1.0
# ZeroMQ heartbeats find a daemon whose host vanished without closing the connection.
_HEARTBEAT_IVL_MS = 2_000
_HEARTBEAT_TIMEOUT_MS = 10_000


def decide_body(
    state: Any,
    questions: Mapping[str, Choice | Noul | Score | dict],
    model: str | None = None,
    media: Iterable[Media | Image | Video | dict] | None = None,
) -> dict[str, Any]:
    """The wire body of a `decide` request (decide_many takes these, or the same with typed questions)."""
    body: dict[str, Any] = {"state": state, "questions": questions_to_wire(questions)}
    if model is not None:
        body["model"] = model
    if media is not None:
        body["media"] = [_media_to_wire(item) for item in media]
    return body


def _as_wire_body(body: Any) -> Any:
    """A decide body whose questions (and media) may be typed, as the wire carries it.

    What is not a body map at all is left for the daemon to refuse, in place.
    """
    if not isinstance(body, Mapping):
        return body
    wire = dict(body)
    questions = wire.get("questions")
    if isinstance(questions, Mapping) and all(isinstance(q, (Choice, Noul, Score, Mapping))
                                              for q in questions.values()):
        wire["questions"] = questions_to_wire(questions)
    media = wire.get("media")
    if isinstance(media, (list, tuple)) and all(isinstance(m, (Media, Image, Video, Mapping)) for m in media):
        wire["media"] = [_media_to_wire(item) for item in media]
    return wire


def _media_to_wire(item: Media | Image | Video | dict) -> dict:
    if isinstance(item, Media):
        return {"type": item.type, "uri": item.uri}
    if isinstance(item, (Image, Video)):
        return item.to_wire()
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

    `retries`: how many more times a `retryable` error (overloaded,
    shutting_down, worker_lost, deadline_exceeded, ...) is tried again, after
    a growing, jittered pause, within the call's timeout. Only ops that change
    nothing are retried (decide, ping, status, models), each time under a new
    id, so with several endpoints a daemon that is draining or going away is
    ridden over by the others. 0 raises the first error. When a connection
    to a daemon drops (it was stopped or killed, or its host vanished), the
    replies it owed can never come, so such requests still awaited are sent
    again (same ids, within the same `retries` bound); a duplicate reply is
    discarded.

    CurveZMQ (TCP endpoints of a daemon started with --curve-secret-key):
    `server_public_key` is the daemon's public key (z85 text, or the path of
    its .key file), and the client's own pair comes from
    `client_secret_key_file` (a .key_secret file from `jevany-daemon keygen`)
    or from `client_public_key` and `client_secret_key` (z85). The same keys
    are used for every endpoint of this client.
    """

    def __init__(
        self,
        endpoint: str | Sequence[str] | None = None,
        timeout: float | None = 30.0,
        *,
        retries: int = 2,
        context: zmq.Context | None = None,
        server_public_key: str | bytes | os.PathLike | None = None,
        client_secret_key_file: str | os.PathLike | None = None,
        client_public_key: str | bytes | None = None,
        client_secret_key: str | bytes | None = None,
    ) -> None:
        self.endpoints = _endpoint_list(endpoint)
        self._message_limit: int | None = None    # the daemon's, asked when a message is large
        self.timeout = _check_timeout(timeout)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        self.retries = retries
        self._curve = _curve_keys(
            server_public_key, client_secret_key_file, client_public_key, client_secret_key
        )
        self._context = context
        self._socket: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None     # the socket's disconnect events
        self._poller: zmq.Poller | None = None
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
        media: Iterable[Media | Image | Video | dict] | None = None,
        timeout: float | None = None,
    ) -> dict:
        """Ask one decision; returns the reply's `result` (PROTOCOL.md "decide result")."""
        body = decide_body(state, questions, model, media)
        return self._call("decide", body, self._wait(timeout), _REMAINING)

    def decide_many(
        self,
        requests: Iterable[dict],
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list:
        """Pipeline many `decide` bodies over the one socket; results in request order.

        A body is what decide_body() returns, or the same map written by hand;
        its questions may be Choice, Noul and Score objects or plain maps.

        `timeout` bounds the whole batch, retries included; only the requests that
        failed retryably are sent again. With return_exceptions, each failed
        request holds its JevanyError in place; otherwise the first failure (in
        request order) is raised once every reply is in or the time is up.
        """
        bodies = [_as_wire_body(body) for body in requests]
        wait = self._wait(timeout)
        results = self._attempts(
            "decide", bodies, wait, _REMAINING, raise_unsendable=not return_exceptions
        )
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
        return self._call(op, body, self._wait(timeout), timeout_ms)

    def _call(self, op: str, body: dict | None, wait: float | None, timeout_ms) -> dict:
        [outcome] = self._attempts(op, [body], wait, timeout_ms, raise_unsendable=True)
        if isinstance(outcome, JevanyError):
            raise outcome
        return outcome

    def _attempts(
        self, op: str, bodies: list, wait: float | None, timeout_ms, raise_unsendable: bool
    ) -> list:
        """Send every body, then again (new ids, after a pause) those that failed retryably.

        timeout_ms is sent as given, or _REMAINING: the time this call has left.
        """
        deadline = None if wait is None else time.monotonic() + wait
        outcomes: list[Any] = [None] * len(bodies)
        missing = self._missing_sockets()
        if missing:
            # Waiting the whole timeout for a socket file that is not there helps nobody.
            return [JevUnreachableError(missing)] * len(bodies)
        todo = list(range(len(bodies)))
        for attempt in itertools.count():
            left = _left(deadline)
            sendable, slot = [], {}
            for i in todo:
                rid = self._next_id()
                try:
                    payload = self._encode(rid, op, bodies[i], _daemon_ms(timeout_ms, left))
                    sendable.append((rid, payload))
                    slot[rid] = i
                except JevanyError as err:
                    if raise_unsendable and attempt == 0:
                        raise  # nothing has been sent yet
                    outcomes[i] = err
            if sendable:
                for rid, outcome in self._exchange(sendable, op, left, wait).items():
                    outcomes[slot[rid]] = outcome
            todo = [i for i in slot.values() if _worth_retrying(outcomes[i])]
            if not todo or op not in _IDEMPOTENT or attempt >= self.retries:
                return outcomes
            pause = _backoff(attempt)
            if deadline is not None and time.monotonic() + pause >= deadline:
                return outcomes
            time.sleep(pause)

    def _missing_sockets(self) -> str | None:
        """Why no daemon can answer, when every endpoint is an ipc socket file that does not exist."""
        paths = [ipc_path(e) for e in self.endpoints]
        if not paths or any(p is None or p.exists() for p in paths):
            return None
        where = ", ".join(str(p) for p in paths)
        return (f"no daemon at {where}: no socket file there (is the daemon running, and bound there? "
                f"the default endpoint is {default_endpoint()})")

    def close(self) -> None:
        self._closed = True
        sock, monitor, self._socket, self._monitor = self._socket, self._monitor, None, None
        if sock is not None and self._pid == os.getpid():
            sock.disable_monitor()
            monitor.close(linger=0)
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
            self._socket = self._monitor = None
            self._context = None
            self._new_id_space()
        context = zmq.Context.instance() if self._context is None else self._context
        self._socket = _connect(context, self.endpoints, self._curve)
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
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
            payload = encode_request(rid, op, body, timeout_ms)
        except (TypeError, ValueError, OverflowError) as exc:
            # msgpack's own errors for values it cannot carry (sets, huge ints, bad text).
            raise InvalidRequestError(f"{op} body cannot be sent: {exc}", request_id=rid) from exc
        if len(payload) > _LARGE_MESSAGE_BYTES:
            limit = self._daemon_message_limit()
            if limit is not None and len(payload) > limit:
                # ZeroMQ drops a message over the daemon's limit with no reply at all: the
                # caller would only see a timeout that looks like a dead daemon.
                raise InvalidRequestError(
                    f"the {op} request is {len(payload):,} bytes; the daemon at {', '.join(self.endpoints)} "
                    f"accepts at most {limit:,} (its --max-message-bytes, JEVANY_MAX_MESSAGE_BYTES)",
                    request_id=rid)
        return payload

    def _daemon_message_limit(self) -> int | None:
        """The daemon's max_message_bytes (from status, asked once); None if it cannot be asked."""
        if self._message_limit is None:
            try:
                self._message_limit = int(self.status(timeout=5.0)["max_message_bytes"])
            except (JevanyError, KeyError, TypeError, ValueError):
                return None      # send it anyway: the reply, or its absence, says the rest
        return self._message_limit

    def _exchange(
        self, requests: list[tuple[str, bytes]], op: str, wait: float | None, told: float | None
    ) -> dict[str, Any]:
        sock = self._socket_for_caller()
        exchange = _Exchange(requests, resends=self.retries if op in _IDEMPOTENT else 0)
        deadline = None if wait is None else time.monotonic() + wait
        _disconnects(self._monitor)   # drops before this call cost none of its requests
        exchange.send_ready(sock)
        while exchange.awaited:
            poll_ms = _poll_ms(deadline)
            if poll_ms == 0:
                break
            self._poller.modify(sock, zmq.POLLIN | (zmq.POLLOUT if exchange.unsent else 0))
            ready = dict(self._poller.poll(poll_ms))
            if ready.get(self._monitor) and _disconnects(self._monitor):
                exchange.send_again()
            events = ready.get(sock, 0)
            if events & zmq.POLLOUT or (exchange.unsent and self._monitor in ready):
                exchange.send_ready(sock)
            if events & zmq.POLLIN:
                exchange.receive_ready(sock)
        self.discarded += exchange.discarded
        exchange.time_out(op, ", ".join(self.endpoints), told)
        return exchange.outcomes


class _Exchange:
    """One call's requests: which are unsent, which await a reply, what came back."""

    def __init__(self, requests: list[tuple[str, bytes]], resends: int = 0) -> None:
        self.unsent = deque(requests)
        self.payloads = dict(requests)
        self.awaited = {rid for rid, _ in requests}
        self.sent: set[str] = set()
        self.resends_left = dict.fromkeys(self.awaited, resends)
        self.outcomes: dict[str, Any] = {}
        self.discarded = 0
        self.unattributed: JevanyError | None = None

    def send_ready(self, sock: zmq.Socket) -> None:
        while self.unsent:
            try:
                sock.send(self.unsent[0][1], zmq.NOBLOCK)
            except zmq.Again:
                return  # no daemon connected yet, or the send queue is full
            self.sent.add(self.unsent.popleft()[0])

    def send_again(self) -> None:
        """A connection dropped: whatever it carried will never be answered, so send what is
        still awaited once more (it may have gone to a daemon that is fine; the duplicate
        reply is discarded)."""
        queued = {rid for rid, _ in self.unsent}
        for rid in sorted(self.awaited - queued):
            if self.resends_left[rid] > 0:
                self.resends_left[rid] -= 1
                self.unsent.append((rid, self.payloads[rid]))

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
        for rid in self.awaited:
            sent = rid in self.sent
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


def _connect(context: zmq.Context, endpoints: list[str], curve: tuple | None) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = curve
    # Queue requests only on completed connections: a daemon that is down then
    # holds none of them, and with several endpoints the live ones take the load.
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.SNDHWM, _SEND_HWM)
    # Replies are bounded by the requests this client sent; a receive limit would
    # only make the daemon's ROUTER drop replies silently.
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)
    for endpoint in endpoints:
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ValueError(f"cannot connect to {endpoint!r}: {exc}") from exc
    return sock


def _disconnects(monitor: zmq.Socket) -> int:
    """Take the disconnect events waiting on the monitor socket; how many there were."""
    seen = 0
    while True:
        try:
            monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return seen
        seen += 1


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


_REMAINING = object()   # timeout_ms: tell the daemon how long this call has left


def _daemon_ms(timeout_ms, left: float | None) -> int | None:
    if timeout_ms is _REMAINING:
        return None if left is None else math.ceil(left * 1000)
    return timeout_ms


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.001)


def _worth_retrying(outcome: Any) -> bool:
    # A timeout has spent the call's time already; anything else the daemon calls retryable is.
    if isinstance(outcome, JevTimeoutError):
        return False
    return isinstance(outcome, JevanyError) and outcome.retryable


def _backoff(attempt: int) -> float:
    # Jittered, so a fleet of clients turned away together does not come back together.
    return min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2**attempt) * random.uniform(0.5, 1.0)


def _curve_keys(server, secret_file, public, secret) -> tuple[bytes, bytes, bytes] | None:
    """(server public, client public, client secret) as z85 bytes, or None for plain connections."""
    if server is None:
        if secret_file is not None or public is not None or secret is not None:
            raise ValueError(
                "client keys need server_public_key too (the daemon's .key file or z85 key)"
            )
        return None
    if _looks_like_key(server):
        server_key = _z85(server)
    else:
        server_key = _read_key(server, secret=False)[0]
    if secret_file is not None:
        if public is not None or secret is not None:
            raise ValueError(
                "give client_secret_key_file or client_public_key + client_secret_key, not both"
            )
        client_public, client_secret = _read_key(secret_file, secret=True)
    elif public is not None and secret is not None:
        client_public, client_secret = _z85(public), _z85(secret)
    else:
        raise ValueError(
            "server_public_key needs the client's own key pair: client_secret_key_file, "
            "or client_public_key and client_secret_key"
        )
    return server_key, client_public, client_secret


def _looks_like_key(value) -> bool:
    if not isinstance(value, (str, bytes)) or len(value) != 40:
        return False
    return not os.path.exists(os.fsdecode(value))


def _z85(value: str | bytes) -> bytes:
    from zmq.utils import z85

    try:
        key = value.encode("ascii") if isinstance(value, str) else bytes(value)
        if len(key) == 40 and len(z85.decode(key)) == 32:
            return key
    except (ValueError, TypeError):
        pass
    raise ValueError("a CurveZMQ key is 40 characters of z85 text")


def _read_key(path: str | os.PathLike, secret: bool) -> tuple[bytes, bytes | None]:
    """Read a key file in ZeroMQ's certificate format (what `jevany-daemon keygen` writes)."""
    from zmq.auth import load_certificate   # only clients that use CURVE pay for the import

    try:
        public, secret_key = load_certificate(Path(path).expanduser())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the CurveZMQ key file {path}: {exc}") from None
    if secret and not secret_key:
        raise ValueError(f"{path} holds no secret key; give the .key_secret file")
    return _z85(public), (_z85(secret_key) if secret_key else None)


def _poll_ms(deadline: float | None) -> int | None:
    if deadline is None:
        return None
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))
