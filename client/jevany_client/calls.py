"""What JevClient and AsyncJevClient share: options, request ids, the socket, and one call's tries.

A call's tries (send, collect, wait a jittered pause, send the retryable
failures again under new ids) are written once, as a generator of steps that
each client carries out its own way, blocking or awaited:

    Exchange   send these requests, each to the daemon its routing picks; the client
               answers {id: result map or JevanyError}
    Pause      sleep this long; the client answers None
    ASK_LIMIT  the daemon's max_message_bytes; the client answers it, or None

The generator returns the outcomes in request order.
"""

import itertools
import math
import random
import secrets
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from . import discovery
from .discovery import is_ipv6
from .endpoints import endpoint_list, missing_sockets
from .errors import InvalidRequestError, JevanyError, JevTimeoutError, JevUnreachableError, error_from_wire
from .keys import curve_keys
from .protocol import decode_reply, encode_request
from .routing import affinity_key, check_routing

# Ops that change nothing on the daemon, so sending one again is harmless.
IDEMPOTENT = frozenset({"decide", "ping", "status", "models"})
# A message this big is first checked against the daemon's own size limit.
LARGE_MESSAGE_BYTES = 64 << 10
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0
# Sends wait (within the call's timeout) once this many messages are queued
# towards the daemon, instead of growing memory without bound.
_SEND_HWM = 10_000
# ZeroMQ heartbeats find a daemon whose host vanished without closing the connection.
_HEARTBEAT_IVL_MS = 2_000
_HEARTBEAT_TIMEOUT_MS = 10_000

# The socket events that take a peer out of the pool and bring it back. Not EVENT_CONNECTED: with
# IMMEDIATE a socket cannot send to a daemon until its handshake is done, and a peer taken as connected
# before then was skipped as full (its first requests went to another daemon, breaking affinity).
PEER_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED

REMAINING = object()   # timeout_ms: tell the daemon how long this call has left
ASK_LIMIT = object()


@dataclass(frozen=True)
class Exchange:
    op: str
    requests: list[tuple[str, bytes]]    # (id, payload), in sending order
    wait: float | None                   # how long this round may take; None: no limit
    told: float | None                   # the call's whole timeout, which a timeout message names
    resends: int                         # times a request may go again when a connection drops
    keys: dict = field(default_factory=dict)   # id -> affinity key, for routing=affinity


@dataclass(frozen=True)
class Pause:
    seconds: float


class ClientOptions:
    """The options, ids and counters both clients keep; each subclass owns its socket."""

    def __init__(
        self,
        endpoint: str | Sequence[str] | None,
        timeout: float | None,
        retries: int,
        server_public_key,
        client_secret_key_file,
        client_public_key,
        client_secret_key,
        routing: str | None = None,
        resolve_every: float = 5.0,
    ) -> None:
        self.endpoints = endpoint_list(endpoint)
        self.timeout = check_timeout(timeout)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        self.retries = retries
        named = [discovery.parse(e) for e in self.endpoints if discovery.is_discovered(e)]  # refused now, not at use
        several = len(self.endpoints) > 1 or bool(named)
        self.routing = check_routing(routing, several)
        self.resolve_every = check_timeout(resolve_every)
        self._curve = curve_keys(
            server_public_key, client_secret_key_file, client_public_key, client_secret_key
        )
        self._message_limit: int | None = None    # the daemon's, asked when a message is large
        self._new_id_space()
        self.discarded = 0  # replies dropped because no call awaited them

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoints!r}, timeout={self.timeout!r})"

    def _new_id_space(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._counter = itertools.count(1)

    def _next_id(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"

    def _wait(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else check_timeout(timeout)

    def _learn_limit(self, status: Any) -> int | None:
        """Keep the daemon's max_message_bytes from its status result; None when it has none."""
        try:
            self._message_limit = int(status["max_message_bytes"])
        except (KeyError, TypeError, ValueError):
            return None      # send it anyway: the reply, or its absence, says the rest
        return self._message_limit

    def _tries(
        self, op: str, bodies: list, wait: float | None, timeout_ms, raise_unsendable: bool,
        affinity: Any = None,
    ) -> Generator[Any, Any, list]:
        """Send every body, then again (new ids, after a pause) those that failed retryably.

        timeout_ms is sent as given, or REMAINING: the time this call has left.
        affinity: the key of every body (a str), one per body (a list), or None for each
        state's own (affinity_key); read only under routing="affinity".
        """
        deadline = None if wait is None else time.monotonic() + wait
        outcomes: list[Any] = [None] * len(bodies)
        missing = missing_sockets(self.endpoints)
        if missing:
            # Waiting the whole timeout for a socket file that is not there helps nobody.
            return [JevUnreachableError(missing)] * len(bodies)
        todo = list(range(len(bodies)))
        keys = self._keys(op, bodies, affinity)
        for attempt in itertools.count():
            left = _left(deadline)
            sendable, slot = [], {}
            for i in todo:
                rid = self._next_id()
                try:
                    payload = yield from self._encode(rid, op, bodies[i], _daemon_ms(timeout_ms, left))
                    sendable.append((rid, payload))
                    slot[rid] = i
                except JevanyError as err:
                    if raise_unsendable and attempt == 0:
                        raise  # nothing has been sent yet
                    outcomes[i] = err
            if sendable:
                resends = self.retries if op in IDEMPOTENT else 0
                replies = yield Exchange(op, sendable, left, wait, resends,
                                         {rid: keys[i] for rid, i in slot.items()} if keys else {})
                for rid, outcome in replies.items():
                    outcomes[slot[rid]] = outcome
            todo = [i for i in slot.values() if worth_retrying(outcomes[i])]
            if not todo or op not in IDEMPOTENT or attempt >= self.retries:
                return outcomes
            pause = backoff(attempt)
            if deadline is not None and time.monotonic() + pause >= deadline:
                return outcomes
            yield Pause(pause)

    def _keys(self, op: str, bodies: list, affinity: Any) -> list | None:
        """Each body's affinity key, or None when routing does not use keys."""
        if self.routing != "affinity" or op != "decide":
            return None
        given = affinity if isinstance(affinity, (list, tuple)) else [affinity] * len(bodies)
        if len(given) != len(bodies):
            raise ValueError(f"affinity: {len(given)} keys for {len(bodies)} requests")
        for key in given:
            if key is not None and not isinstance(key, str):
                raise ValueError(f"affinity keys are str or None, got {key!r}")
        return [key if key is not None else affinity_key(_state(body)) for key, body in zip(given, bodies)]

    def _encode(self, rid: str, op: str, body: Any, timeout_ms: int | None) -> Generator[Any, Any, bytes]:
        try:
            payload = encode_request(rid, op, body, timeout_ms)
        except (TypeError, ValueError, OverflowError) as exc:
            # msgpack's own errors for values it cannot carry (sets, huge ints, bad text).
            raise InvalidRequestError(f"{op} body cannot be sent: {exc}", request_id=rid) from exc
        if len(payload) > LARGE_MESSAGE_BYTES:
            limit = self._message_limit if self._message_limit is not None else (yield ASK_LIMIT)
            if limit is not None and len(payload) > limit:
                # ZeroMQ drops a message over the daemon's limit with no reply at all: the
                # caller would only see a timeout that looks like a dead daemon.
                raise InvalidRequestError(
                    f"the {op} request is {len(payload):,} bytes; the daemon at {', '.join(self.endpoints)} "
                    f"accepts at most {limit:,} (its --max-message-bytes, JEVANY_MAX_MESSAGE_BYTES)",
                    request_id=rid)
        return payload


def retire_dropped_pipes(sock: zmq.Socket) -> None:
    """Let the socket act on the pipe closures the I/O thread has queued for it, so a
    send from now on is not routed into a dropped connection (reading ZMQ_EVENTS
    processes the socket's pending commands, unlike a send, which may skip them).

    libzmq reports a drop before it retires the connection's pipe, so a request
    sent between the two would vanish with no further event: a dropped peer is
    out of the pool until its next connection is made, and this runs then."""
    sock.getsockopt(zmq.EVENTS)


_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)     # plain ints: pyzmq's enums cost a call each


def has_message(sock: zmq.Socket) -> bool:
    """Whether a message waits on the socket: one option read (about 1.5 us here), where a receive
    that finds nothing raises zmq.Again (about 3 us: an exception, and its message looked up).
    Reading the option also resets the edge of the socket's descriptor, as draining it to empty does."""
    return bool(sock.getsockopt(_EVENTS) & _POLLIN)


def monitor_event(frames: list[bytes]) -> int:
    return parse_monitor_message(frames)["event"]


def read_reply(payload: bytes) -> tuple[str | int | None, Any, Any]:
    """A reply's id, what it brings (its result map, or its typed error) and the daemon's load."""
    try:
        reply = decode_reply(payload)
    except JevanyError as err:
        return err.request_id, err, None
    rid = reply["id"]
    if reply["ok"]:
        return rid, reply["result"], reply.get("load")
    return rid, error_from_wire(reply["error"], request_id=rid), reply.get("load")


def timeout_error(
    step: Exchange, where: str, rid: str, sent: bool, unattributed: JevanyError | None
) -> JevTimeoutError:
    """What a request gets when its reply did not come within the call's time."""
    if not sent:
        message = f"daemon not reachable at {where} within {step.told:g}s; the {step.op} request was not sent"
    else:
        message = f"no reply to {step.op} from {where} within {step.told:g}s"
        if unattributed is not None:
            message += (f" (a reply without a usable id also came: "
                        f"{unattributed.code}: {unattributed.message})")
    return JevTimeoutError(message, request_id=rid, sent=sent)


def raise_first_error(results: list) -> None:
    for result in results:
        if isinstance(result, JevanyError):
            raise result


def connect(context: zmq.Context, endpoints: list[str], curve: tuple | None) -> zmq.Socket:
    """A DEALER connected to the endpoints: one daemon's, as each client holds one socket per daemon
    (an asyncio context gives an asyncio socket)."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if any(is_ipv6(e) for e in endpoints):
        sock.setsockopt(zmq.IPV6, 1)     # an AAAA record's address; ZeroMQ connects only IPv4 without it
    if curve is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = curve
    # Queue requests only on completed connections: a daemon that is down then
    # holds none of them (a send is refused, and the routing picks another).
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


def check_timeout(timeout: float | None) -> float | None:
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if timeout is not None and not (number and 0 < timeout < math.inf):
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    return timeout


def worth_retrying(outcome: Any) -> bool:
    # A JevTimeoutError is retryable too, but comes only once an exchange has waited out what the
    # call had left: the deadline has passed, and the guard before each pause (_tries) ends the call.
    return isinstance(outcome, JevanyError) and outcome.retryable


def backoff(attempt: int) -> float:
    # Jittered, so a fleet of clients turned away together does not come back together.
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**attempt) * random.uniform(0.5, 1.0)


def _state(body: Any) -> Any:
    return body.get("state") if isinstance(body, dict) else None


def _daemon_ms(timeout_ms, left: float | None) -> int | None:
    if timeout_ms is REMAINING:
        return None if left is None else math.ceil(left * 1000)
    return timeout_ms


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.001)

