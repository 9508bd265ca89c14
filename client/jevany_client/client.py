"""JevClient: one DEALER socket per daemon, pipelined requests, replies matched by id."""

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
    PEER_EVENTS,
    REMAINING,
    ClientOptions,
    Exchange,
    Pause,
    connect,
    has_message,
    monitor_event,
    raise_first_error,
    retire_dropped_pipes,
    timeout_error,
)
from .errors import JevanyError
from .fleet import Fleet, Peer
from .questions import Choice, Image, Noul, Score, Video
from .schema import Media

__all__ = ["JevClient", "decide_body"]

WARMING_LOOK_S = 0.05     # while a first connection is awaited, how often the wait looks again


class JevClient(ClientOptions):
    """A connection to one or more jevany daemons, one ZeroMQ DEALER socket to each.

    Threads: a client belongs to the thread that first uses it, because a ZeroMQ
    socket must not be shared between threads. Calling it from any other thread
    raises RuntimeError; create one client per thread (they share one ZeroMQ
    context). `close()` alone may come from another thread, once the owner is
    done with the client.

    Processes: after a fork the child transparently opens its own sockets (and
    context) on first use; the parent's sockets are never touched in the child.

    `endpoint` is one endpoint or a list of them; `dns+tcp://NAME:PORT` stands
    for every address NAME resolves to (`dns+tcp://NAME`: its SRV records),
    looked up again every `resolve_every` seconds (discovery.py). With several
    daemons, `routing` picks the daemon for each request (routing.py):
    "least_loaded" (the default), "affinity" (an agent's states stay on one
    daemon's prefix cache: the key is each call's `affinity=`, else a digest of
    the state's head) or "round_robin". A daemon whose connection drops or that
    answers shutting_down leaves the pool at once, until a new connection to
    it is made. `timeout` (seconds, None for no limit) applies to every call
    that does not pass its own; on expiry a call raises JevTimeoutError and the
    client stays usable, and a reply that arrives later is discarded rather
    than handed to a later call.

    `retries`: how many more times a `retryable` error (overloaded,
    shutting_down, worker_lost, deadline_exceeded, ...) is tried again, after
    a growing, jittered pause, within the call's timeout. Only ops that change
    nothing are retried (decide, ping, status, models), each time under a new
    id, so with several endpoints a daemon that is draining or going away is
    ridden over by the others. 0 raises the first error. When a connection
    to a daemon drops (it was stopped or killed, or its host vanished), the
    replies it owed can never come, so such requests still awaited are sent
    again (same ids, within the same `retries` bound) to a daemon in the pool;
    a duplicate reply is discarded.

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
        routing: str | None = None,
        resolve_every: float = 5.0,
    ) -> None:
        super().__init__(endpoint, timeout, retries, server_public_key, client_secret_key_file,
                         client_public_key, client_secret_key, routing, resolve_every)
        self._context = context
        self._fleet: Fleet | None = None
        self._by_socket: dict[zmq.Socket, Peer] = {}     # each peer's socket and monitor
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
        affinity: str | None = None,
    ) -> dict:
        """Ask one decision; returns the reply's `result` (PROTOCOL.md "decide result").

        affinity: with routing="affinity", the key that keeps calls on one daemon
        (an agent's session id); None: a digest of the state's head."""
        body = decide_body(state, questions, model, media)
        return self._call("decide", body, self._wait(timeout), REMAINING, affinity)

    def decide_request(self, body: Mapping[str, Any], timeout: float | None = None,
                       affinity: str | None = None) -> dict:
        """Ask one decision given as its body: what decide_body() returns, or the same map
        written by hand (a suite line); its questions may be typed. Returns its result."""
        return self._call("decide", as_wire_body(body), self._wait(timeout), REMAINING, affinity)

    def decide_many(
        self,
        requests: Iterable[dict],
        timeout: float | None = None,
        return_exceptions: bool = False,
        affinity: str | Sequence[str | None] | None = None,
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

    def _call(self, op: str, body: dict | None, wait: float | None, timeout_ms, affinity=None) -> dict:
        [outcome] = self._run(self._tries(op, [body], wait, timeout_ms, raise_unsendable=True, affinity=affinity))
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
        fleet, self._fleet = self._fleet, None
        if fleet is not None and self._pid == os.getpid():
            for peer in fleet.peers.values():
                peer.close_sockets()

    def shares(self) -> dict[str, int]:
        """Requests sent to each daemon so far, by endpoint (resends included)."""
        return {} if self._fleet is None else {e: p.sent for e, p in sorted(self._fleet.peers.items())}

    # -- the sockets, one per daemon ----------------------------------------------

    def _ready_for_caller(self) -> None:
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

    def _open(self, pid: int) -> None:
        if self._pid is not None:
            # Forked: the inherited sockets and context belong to the parent's I/O thread,
            # which does not exist here: drop them without closing anything.
            self._context = None
            self._new_id_space()
        self._context = zmq.Context.instance() if self._context is None else self._context
        self._fleet = Fleet(self.endpoints, self.routing, self.resolve_every)
        self._by_socket = {}
        self._poller = zmq.Poller()
        self._pid = pid
        self._owner = threading.get_ident()

    def _sync_fleet(self) -> None:
        """Open the daemons discovery found, close the retired ones that hold nothing."""
        added, closing = self._fleet.refresh()
        for peer in added:
            peer.socket = self._fleet.connect(peer, lambda: connect(self._context, [peer.endpoint], self._curve))
            peer.monitor = peer.socket.get_monitor_socket(PEER_EVENTS)
            for sock in (peer.socket, peer.monitor):
                self._poller.register(sock, zmq.POLLIN)
                self._by_socket[sock] = peer
        for peer in closing:
            for sock in (peer.socket, peer.monitor):
                self._poller.unregister(sock)
                del self._by_socket[sock]
            peer.close_sockets()

    def _exchange(self, step: Exchange) -> dict[str, Any]:
        self._ready_for_caller()
        self._sync_fleet()
        exchange = _Exchange(step, self._fleet)
        deadline = None if step.wait is None else time.monotonic() + step.wait
        self._read_events(exchange)   # drops before this call cost none of its requests
        exchange.send_ready()
        while exchange.awaited:
            poll_ms = _poll_ms(deadline)
            if poll_ms == 0:
                break
            self._arm(exchange)
            ready = dict(self._poller.poll(_sooner(poll_ms, self._next_look())))
            self._sync_fleet()
            self._read_events(exchange)
            for sock, events in ready.items():
                peer = self._by_socket.get(sock)
                if peer is not None and sock is peer.socket and events & zmq.POLLIN:
                    exchange.receive_ready(peer)
            if exchange.unsent:
                exchange.send_ready()
        self.discarded += exchange.discarded
        where = ", ".join(self.endpoints) + (f" ({self._fleet.problem})" if self._fleet.problem else "")
        exchange.time_out(step, where)
        return exchange.outcomes

    def _next_look(self) -> float | None:
        """When to look again without an event: a lookup due, or a first connection's grace passing."""
        return _earliest(self._fleet.refresh_in(), WARMING_LOOK_S if self._fleet.warming() else None)

    def _arm(self, exchange: "_Exchange") -> None:
        """Wake for replies from every daemon, and for room on the candidates while requests wait."""
        writable = set(self._fleet.candidates()) if exchange.unsent else set()
        for peer in self._fleet.peers.values():
            self._poller.modify(peer.socket, zmq.POLLIN | (zmq.POLLOUT if peer in writable else 0))

    def _read_events(self, exchange: "_Exchange") -> None:
        """Connections made and dropped, from each daemon's monitor."""
        for peer in list(self._fleet.peers.values()):
            while has_message(peer.monitor):
                try:
                    frames = peer.monitor.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if monitor_event(frames) == zmq.EVENT_DISCONNECTED:
                    peer.dropped = True
                    exchange.dropped(peer)
                else:
                    retire_dropped_pipes(peer.socket)
                    peer.connected()


class _Exchange:
    """One call's requests: which are unsent, which await a reply and where, what came back."""

    def __init__(self, step: Exchange, fleet: Fleet) -> None:
        self.fleet = fleet
        self.unsent = deque(rid for rid, _ in step.requests)
        self.payloads = dict(step.requests)
        self.keys = step.keys
        self.awaited = set(self.payloads)
        self.sent: set[str] = set()
        self.where: dict[str, Peer] = {}
        self.resends_left = dict.fromkeys(self.awaited, step.resends)
        self.outcomes: dict[str, Any] = {}
        self.discarded = 0
        self.unattributed: JevanyError | None = None

    def send_ready(self) -> None:
        blocked: set[Peer] = set()
        while self.unsent:
            rid = self.unsent[0]
            peer = self.fleet.choose(self.keys.get(rid), blocked)
            if peer is None:
                return      # no daemon can take it now: not connected yet, or its queue full
            try:
                peer.socket.send(self.payloads[rid], zmq.NOBLOCK)
            except zmq.Again:
                if peer.warming(self.fleet.clock()):
                    return      # its first connection is on its way: wait for it (fleet.CONNECT_GRACE_S)
                blocked.add(peer)
                continue
            self.unsent.popleft()
            self.sent.add(rid)
            self.where[rid] = peer
            peer.pending.add(rid)
            peer.sent += 1

    def dropped(self, peer: Peer) -> None:
        """A connection dropped: what it carried will never be answered, so what is still awaited
        from it goes again, to a daemon in the pool (a duplicate reply is discarded)."""
        for rid in sorted(rid for rid, at in self.where.items() if at is peer):
            del self.where[rid]
            peer.pending.discard(rid)
            if self.resends_left[rid] > 0:
                self.resends_left[rid] -= 1
                self.unsent.append(rid)

    def receive_ready(self, peer: Peer) -> None:
        for rid, outcome in peer.replies(self.fleet.clock):
            self._settle(rid, outcome)

    def _settle(self, rid: str | int | None, outcome: Any) -> None:
        if rid in self.awaited:
            self.awaited.remove(rid)
            self.outcomes[rid] = outcome
            self._release(rid)
            return
        # A late reply to a call that already timed out, or one the daemon could
        # not tie to an id: never hand it to a request it does not belong to.
        self.discarded += 1
        if rid is None and isinstance(outcome, JevanyError):
            self.unattributed = outcome

    def _release(self, rid: str) -> None:
        peer = self.where.pop(rid, None)
        if peer is not None:
            peer.pending.discard(rid)

    def time_out(self, step: Exchange, where: str) -> None:
        for rid in self.awaited:
            self._release(rid)
            self.outcomes[rid] = timeout_error(step, where, rid, rid in self.sent, self.unattributed)


def _earliest(*seconds: float | None) -> float | None:
    given = [s for s in seconds if s is not None]
    return min(given) if given else None


def _poll_ms(deadline: float | None) -> int | None:
    if deadline is None:
        return None
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


def _sooner(poll_ms: int | None, seconds: float | None) -> int | None:
    if seconds is None:
        return poll_ms
    ms = math.ceil(seconds * 1000)
    return ms if poll_ms is None else min(poll_ms, ms)
