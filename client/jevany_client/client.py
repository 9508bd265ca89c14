"""JevClient: one DEALER socket, pipelined requests, replies matched by id."""

import math
import os
import threading
import time
from collections import deque
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any

import zmq

from .bodies import as_wire_body, decide_body
from .calls import (
    ASK_LIMIT,
    DROP_EVENTS,
    REMAINING,
    ClientOptions,
    Drops,
    Exchange,
    Pause,
    connect,
    raise_first_error,
    read_reply,
    retire_dropped_pipes,
    timeout_error,
)
from .errors import JevanyError
from .questions import Choice, Image, Noul, Score, Video
from .schema import Media

__all__ = ["JevClient", "decide_body"]


class JevClient(ClientOptions):
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
        super().__init__(endpoint, timeout, retries, server_public_key, client_secret_key_file,
                         client_public_key, client_secret_key)
        self._context = context
        self._socket: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None     # the socket's connection events
        self._drops = Drops()
        self._poller: zmq.Poller | None = None
        self._pid: int | None = None
        self._owner: int | None = None
        self._lock = threading.Lock()
        self._closed = False

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
        return self._call("decide", body, self._wait(timeout), REMAINING)

    def decide_request(self, body: Mapping[str, Any], timeout: float | None = None) -> dict:
        """Ask one decision given as its body: what decide_body() returns, or the same map
        written by hand (a suite line); its questions may be typed. Returns its result."""
        return self._call("decide", as_wire_body(body), self._wait(timeout), REMAINING)

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
        bodies = [as_wire_body(body) for body in requests]
        results = self._run(self._tries("decide", bodies, self._wait(timeout), REMAINING,
                                        raise_unsendable=not return_exceptions))
        if not return_exceptions:
            raise_first_error(results)
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
        [outcome] = self._run(self._tries(op, [body], wait, timeout_ms, raise_unsendable=True))
        if isinstance(outcome, JevanyError):
            raise outcome
        return outcome

    def _run(self, tries: Generator[Any, Any, list]) -> list:
        """Carry out a call's tries (calls.py), blocking; returns their outcomes."""
        answer = None
        while True:
            try:
                step = tries.send(answer)
            except StopIteration as done:
                return done.value
            if step is ASK_LIMIT:
                answer = self._daemon_message_limit()
            elif isinstance(step, Pause):
                time.sleep(step.seconds)
                answer = None
            else:
                answer = self._exchange(step)

    def _daemon_message_limit(self) -> int | None:
        """The daemon's max_message_bytes, from its status; None if it cannot be asked."""
        try:
            return self._learn_limit(self.status(timeout=5.0))
        except JevanyError:
            return None

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
        self._socket = connect(context, self.endpoints, self._curve)
        self._monitor = self._socket.get_monitor_socket(DROP_EVENTS)
        self._drops = Drops()
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._context = context
        self._pid = pid
        self._owner = threading.get_ident()

    def _exchange(self, step: Exchange) -> dict[str, Any]:
        sock = self._socket_for_caller()
        exchange = _Exchange(step.requests, resends=step.resends)
        deadline = None if step.wait is None else time.monotonic() + step.wait
        self._read_drops()   # drops before this call cost none of its requests
        exchange.send_ready(sock)
        while exchange.awaited:
            poll_ms = _poll_ms(deadline)
            if poll_ms == 0:
                break
            self._poller.modify(sock, zmq.POLLIN | (zmq.POLLOUT if exchange.unsent else 0))
            ready = dict(self._poller.poll(_sooner(poll_ms, self._drops.wait_s(time.monotonic()))))
            resend = self._read_drops()
            if resend:
                retire_dropped_pipes(sock)
                exchange.send_again()
            events = ready.get(sock, 0)
            if events & zmq.POLLOUT or (exchange.unsent and resend):
                exchange.send_ready(sock)
            if events & zmq.POLLIN:
                exchange.receive_ready(sock)
        self.discarded += exchange.discarded
        exchange.time_out(step, ", ".join(self.endpoints))
        return exchange.outcomes

    def _read_drops(self) -> bool:
        """Take the monitor's waiting events; True when a drop's requests should go again now."""
        due = False
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return self._drops.note(None, time.monotonic()) or due
            due = self._drops.note(frames, time.monotonic()) or due


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
            self._settle(*read_reply(frames[-1]))

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

    def time_out(self, step: Exchange, where: str) -> None:
        for rid in self.awaited:
            self.outcomes[rid] = timeout_error(step, where, rid, rid in self.sent, self.unattributed)


def _poll_ms(deadline: float | None) -> int | None:
    if deadline is None:
        return None
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


def _sooner(poll_ms: int | None, seconds: float | None) -> int | None:
    if seconds is None:
        return poll_ms
    ms = math.ceil(seconds * 1000)
    return ms if poll_ms is None else min(poll_ms, ms)
