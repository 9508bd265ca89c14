"""AsyncJevClient: JevClient for asyncio, with many calls in flight over one DEALER socket per daemon."""

import asyncio
import os
from contextlib import aclosing
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Generator, Iterable, Mapping, Sequence
from typing import Any

import zmq

from .awaited import CLOSED, Awaited, consume, running_loop
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
from .streaming import as_they_finish

__all__ = ["AsyncJevClient"]

PEER_WAIT_S = 0.25    # a request no daemon can take looks again this often, whatever woke it or not
WARMING_LOOK_S = 0.05  # and this often while a daemon's first connection is awaited


class AsyncJevClient(ClientOptions):
    """JevClient for asyncio: `await client.decide(...)`, any number of calls at once.

    Every call of every task goes over one ZeroMQ DEALER socket per daemon;
    one reader task per socket hands each reply to the call that awaits its
    id. The endpoints (dns+tcp:// discovery included), `routing`, CurveZMQ
    keys, `timeout`, `retries` (with their pause that doubles from 50 ms) and
    typed errors are JevClient's, and so are the methods, as coroutines.

    Cancelling a call drops it: its reply, when it comes, is discarded and
    counted in `discarded`, never handed to another call. `await close()`
    (or leaving `async with`) makes every call still waiting raise
    RuntimeError at once, and later calls too.

    A client belongs to the event loop it is first used in; another loop gets
    RuntimeError (create one client per loop). After a fork the child opens
    its own socket on first use.
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
        if context is not None and type(context) is not zmq.Context:
            context = zmq.Context.shadow(context.underlying)    # an asyncio context's I/O threads, plain sockets
        self._context = context
        self._fleet: Fleet | None = None
        self._watched: list[int] = []            # the file descriptors the loop reads for the sockets
        self._to_read: set[Peer] = set()         # peers whose sockets were touched: drain them soon
        self._tasks: list[asyncio.Task] = []     # discovery's
        self._changed = asyncio.Event()     # replaced, the old one set, when a daemon joins or connects
        self._backlog: deque = deque()      # (id, entry, waiter): requests no daemon could take yet
        self._flusher: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None
        self._awaited: dict[str, Awaited] = {}
        self._closed: str | None = None     # why calls are refused, once they are

    async def __aenter__(self) -> "AsyncJevClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- public operations (JevClient's, awaited) -------------------------------

    async def decide(
        self,
        state: Any,
        questions: Mapping[str, Choice | Noul | Score | dict],
        model: str | None = None,
        media: Iterable[Media | Image | Video | dict] | None = None,
        timeout: float | None = None,
        affinity: str | None = None,
    ) -> dict:
        """Ask one decision; returns the reply's `result` (PROTOCOL.md "decide result")."""
        body = decide_body(state, questions, model, media)
        return await self._call("decide", body, self._wait(timeout), REMAINING, affinity)

    async def decide_request(self, body: Mapping[str, Any], timeout: float | None = None,
                             affinity: str | None = None) -> dict:
        """Ask one decision given as its body (decide_body()'s, or a suite line's); returns its result."""
        return await self._call("decide", as_wire_body(body), self._wait(timeout), REMAINING, affinity)

    async def decide_many(
        self,
        requests: Iterable[dict],
        timeout: float | None = None,
        return_exceptions: bool = False,
        affinity: str | Sequence[str | None] | None = None,
    ) -> list:
        """JevClient.decide_many, awaited: many bodies, results in request order."""
        bodies = [as_wire_body(body) for body in requests]
        results = await self._run(self._tries("decide", bodies, self._wait(timeout), REMAINING,
                                              raise_unsendable=not return_exceptions, affinity=affinity))
        if not return_exceptions:
            raise_first_error(results)
        return results

    async def decide_stream(self, requests: Iterable[dict] | AsyncIterable[dict], in_flight: int = 32,
                            timeout: float | None = None) -> AsyncIterator[tuple[int, dict | JevanyError]]:
        """Many bodies, read from `requests` as slots free, at most `in_flight` at once; yields (index,
        result or its JevanyError) for each as it finishes, so a source of any length answers as it goes.
        `timeout` bounds each request, retries included (decide_many's bounds the whole batch)."""
        async def one(body):
            return await self.decide_request(body, timeout)

        outcomes = as_they_finish(requests, in_flight, one)
        async with aclosing(outcomes):       # closing this stream early cancels what is in flight at once
            async for index, outcome in outcomes:
                yield index, outcome

    async def ping(self, timeout: float | None = None) -> dict:
        return await self.call("ping", timeout=timeout)

    async def status(self, timeout: float | None = None) -> dict:
        return await self.call("status", timeout=timeout)

    async def models(self, timeout: float | None = None) -> dict:
        return await self.call("models", timeout=timeout)

    async def clear_cache(self, timeout: float | None = None) -> dict:
        """Control op: connect this client to the daemon's control endpoint."""
        return await self.call("clear_cache", timeout=timeout)

    async def drain(self, timeout: float | None = None) -> dict:
        """Control op: connect this client to the daemon's control endpoint."""
        return await self.call("drain", timeout=timeout)

    async def reload(self, timeout: float | None = None) -> dict:
        """Control op: connect this client to the daemon's control endpoint."""
        return await self.call("reload", timeout=timeout)

    async def call(
        self,
        op: str,
        body: dict | None = None,
        timeout: float | None = None,
        timeout_ms: int | None = None,
    ) -> dict:
        """JevClient.call, awaited: any op; an error reply raises its typed JevanyError."""
        return await self._call(op, body, self._wait(timeout), timeout_ms)

    async def close(self) -> None:
        """Refuse calls from now on; the calls still waiting raise RuntimeError at once."""
        if self._closed is None:
            self._closed = "this AsyncJevClient is closed"
        for entry in self._awaited.values():
            if not entry.future.done():
                entry.future.set_result(CLOSED)
        self._fail_backlog()
        fleet, self._fleet = self._fleet, None
        tasks = self._tasks + [self._flusher] * bool(self._flusher)
        self._tasks = []
        if fleet is None or self._pid != os.getpid():
            return      # never opened, or the parent's sockets after a fork: not ours to close
        for task in tasks:
            task.cancel()
        if self._loop is running_loop():
            await asyncio.gather(*tasks, return_exceptions=True)
        for peer in fleet.peers.values():
            self._close_peer(peer)

    def shares(self) -> dict[str, int]:
        """Requests sent to each daemon so far, by endpoint (resends included)."""
        return {} if self._fleet is None else {e: p.sent for e, p in sorted(self._fleet.peers.items())}

    # -- one call ------------------------------------------------------------------

    async def _call(self, op: str, body: dict | None, wait: float | None, timeout_ms, affinity=None) -> dict:
        [outcome] = await self._run(self._tries(op, [body], wait, timeout_ms, raise_unsendable=True,
                                                affinity=affinity))
        if isinstance(outcome, JevanyError):
            raise outcome
        return outcome

    async def _run(self, tries: Generator[Any, Any, list]) -> list:
        """Carry out a call's tries (calls.py), awaited; returns their outcomes."""
        answer = None
        while True:
            try:
                step = tries.send(answer)
            except StopIteration as done:
                return done.value
            if step is ASK_LIMIT:
                answer = await self._daemon_message_limit()
            elif isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                answer = None
            else:
                answer = await self._exchange(step)

    async def _daemon_message_limit(self) -> int | None:
        """The daemon's max_message_bytes, from its status; None if it cannot be asked."""
        try:
            return self._learn_limit(await self.status(timeout=5.0))
        except JevanyError:
            return None

    async def _exchange(self, step: Exchange) -> dict[str, Any]:
        self._ready_for_caller()
        loop = asyncio.get_running_loop()
        entries = {rid: Awaited(loop.create_future(), payload, step.resends, step.keys.get(rid))
                   for rid, payload in step.requests}
        self._awaited.update(entries)
        try:
            async with asyncio.timeout(step.wait):
                for rid, entry in entries.items():
                    await self._deliver(rid, entry)
                await asyncio.wait([entry.future for entry in entries.values()])
        except TimeoutError:
            pass    # what is still awaited times out below
        finally:
            # Cancelled or not, from here on a reply to these ids is discarded.
            for rid, entry in entries.items():
                self._forget(rid, entry)
        if any(entry.future.done() and entry.future.result() is CLOSED for entry in entries.values()):
            raise RuntimeError(self._closed)
        where = ", ".join(self.endpoints)
        if self._fleet is not None and self._fleet.problem:
            where += f" ({self._fleet.problem})"
        return {rid: entry.future.result() if entry.future.done()
                else timeout_error(step, where, rid, entry.sent, entry.unattributed)
                for rid, entry in entries.items()}

    async def _deliver(self, rid: str, entry: Awaited) -> None:
        """Send one request to the daemon its routing picks; while none can take it, wait in
        line behind the requests already waiting, so requests leave in the order they came."""
        if self._closed is not None:
            raise RuntimeError(self._closed)
        if not self._backlog and self._send_now(rid, entry):
            return
        waiter = self._loop.create_future()
        self._backlog.append((rid, entry, waiter))
        if self._flusher is None or self._flusher.done():
            self._flusher = self._loop.create_task(self._flush())
        await waiter

    def _send_now(self, rid: str, entry: Awaited) -> bool:
        blocked: set[Peer] = set()
        while (peer := self._fleet.choose(entry.key, blocked)) is not None:
            try:
                peer.socket.send(entry.payload, zmq.NOBLOCK)
            except zmq.Again:          # not connected yet, or its queue is full
                if peer.warming(self._fleet.clock()):
                    return False       # its first connection is on its way: wait for it
                blocked.add(peer)
                continue
            finally:
                self._soon_read(peer)  # a send can take the edge that announced a reply
            entry.sent, entry.peer = True, peer
            peer.pending.add(rid)
            peer.sent += 1
            return True
        return False

    async def _flush(self) -> None:
        """Send the waiting requests, first come first sent, as daemons can take them."""
        while self._backlog:
            rid, entry, waiter = self._backlog[0]
            if waiter.done() or entry.future.done():
                self._backlog.popleft()          # cancelled, or answered by an earlier send
                if not waiter.done():
                    waiter.set_result(None)
            elif self._send_now(rid, entry):
                self._backlog.popleft()
                waiter.set_result(None)
            else:
                await self._wait_for_a_peer()

    async def _wait_for_a_peer(self) -> None:
        """Until a daemon joins or completes a connection, or PEER_WAIT_S has passed (a full queue
        to a daemon gives no event of its own)."""
        try:
            async with asyncio.timeout(WARMING_LOOK_S if self._fleet.warming() else PEER_WAIT_S):
                await self._changed.wait()
        except TimeoutError:
            pass

    def _fail_backlog(self) -> None:
        backlog, self._backlog = self._backlog, deque()
        for _, _, waiter in backlog:
            if not waiter.done():
                waiter.set_exception(RuntimeError(self._closed))

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _forget(self, rid: str, entry: Awaited) -> None:
        if self._awaited.get(rid) is entry:
            del self._awaited[rid]
        if entry.peer is not None:
            entry.peer.pending.discard(rid)
        if entry.resend is not None:
            entry.resend.cancel()

    # -- the sockets, one per daemon, and their readers ------------------------------------

    def _ready_for_caller(self) -> None:
        if self._closed is not None:
            raise RuntimeError(self._closed)
        loop = asyncio.get_running_loop()
        if self._pid != os.getpid():
            self._open(loop)
        elif loop is not self._loop:
            raise RuntimeError(
                "this AsyncJevClient belongs to another event loop; create one AsyncJevClient per loop"
            )

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._pid is not None:
            # Forked: the inherited sockets, context, readers and calls are the parent's.
            # Drop them without closing anything.
            self._context = None
            self._awaited, self._tasks, self._watched, self._to_read = {}, [], [], set()
            self._backlog, self._flusher = deque(), None
            self._new_id_space()
        self._context = zmq.Context.instance() if self._context is None else self._context
        self._loop, self._pid = loop, os.getpid()
        self._changed = asyncio.Event()
        self._fleet = Fleet(self.endpoints, self.routing, self.resolve_every)
        self._apply(self._fleet.apply(set(self._fleet.static)) if self._fleet.named else self._fleet.refresh())
        if self._fleet.named:
            task = loop.create_task(self._discover())
            task.add_done_callback(self._task_done)
            self._tasks.append(task)

    def _apply(self, change: tuple[list[Peer], list[Peer]]) -> None:
        added, closing = change
        for peer in added:
            peer.socket = self._fleet.connect(peer, lambda: connect(self._context, [peer.endpoint], self._curve))
            peer.monitor = peer.socket.get_monitor_socket(PEER_EVENTS)
            # Read straight from the loop, as the gateway's upstream does: ZeroMQ's descriptor
            # signals edges, so each socket is drained to empty on every wake-up and after
            # anything else that touches it (a send, a read of its events).
            for sock, drain in ((peer.socket, self._read_replies), (peer.monitor, self._read_events)):
                fd = sock.getsockopt(zmq.FD)
                self._loop.add_reader(fd, self._guarded, drain, peer)
                self._watched.append(fd)
            self._soon_read(peer)
        for peer in closing:
            self._close_peer(peer)
        if added:
            self._notify()

    def _close_peer(self, peer: Peer) -> None:
        for sock in (peer.socket, peer.monitor) if peer.monitor is not None else ():
            fd = sock.getsockopt(zmq.FD)
            if fd in self._watched:
                self._watched.remove(fd)
                self._loop.remove_reader(fd)
        peer.close_sockets()

    def _soon_read(self, peer: Peer) -> None:
        """Drain the peer's sockets on the loop's next turn (once, however many sends asked)."""
        if not self._to_read:
            self._loop.call_soon(self._read_asked)
        self._to_read.add(peer)

    def _read_asked(self) -> None:
        peers, self._to_read = self._to_read, set()
        for peer in peers:
            self._guarded(self._read_replies, peer)
            self._guarded(self._read_events, peer)

    def _guarded(self, drain, peer: Peer) -> None:
        if self._closed is not None or peer.socket.closed:
            return
        try:
            drain(peer)
        except Exception as exc:  # noqa: BLE001 - no reply could reach a call any more
            self._fail(f"this AsyncJevClient stopped: its socket failed ({exc!r})")

    async def _discover(self) -> None:
        """Look the dns+tcp:// names up now and every resolve_every seconds; apply what changed."""
        while True:
            wanted = await asyncio.to_thread(self._fleet.lookup)
            self._apply(self._fleet.apply(wanted))
            await asyncio.sleep(self._fleet.refresh_in() or 0)
            self._apply(self._fleet.apply(None))    # close the retired ones that emptied meanwhile

    def _read_replies(self, peer: Peer) -> None:
        for rid, outcome in peer.replies(self._fleet.clock):
            self._settle(rid, outcome)

    def _settle(self, rid: str | int | None, outcome: Any) -> None:
        entry = self._awaited.pop(rid, None) if isinstance(rid, str) else None
        if entry is None or entry.future.done():
            # A late reply to a call that timed out or was cancelled, a duplicate, or
            # one the daemon could not tie to an id: it belongs to no call waiting now.
            self.discarded += 1
            if rid is None and isinstance(outcome, JevanyError):
                for waiting in self._awaited.values():
                    waiting.unattributed = outcome
            return
        entry.future.set_result(outcome)
        if entry.peer is not None:
            entry.peer.pending.discard(rid)
        if entry.resend is not None:
            entry.resend.cancel()

    def _read_events(self, peer: Peer) -> None:
        """Connections made and dropped, from the daemon's monitor."""
        while has_message(peer.monitor):
            try:
                frames = peer.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if monitor_event(frames) == zmq.EVENT_DISCONNECTED:
                peer.dropped = True
                self._send_again(peer)
            else:
                retire_dropped_pipes(peer.socket)
                self._soon_read(peer)
                peer.connected()
                self._notify()

    def _send_again(self, peer: Peer) -> None:
        """A connection dropped: whatever it carried will never be answered, so what is still
        awaited from it goes again, to a daemon in the pool (a duplicate reply is discarded)."""
        for rid, entry in list(self._awaited.items()):
            if entry.peer is not peer:
                continue
            peer.pending.discard(rid)
            entry.peer = None
            # It was sent here, so any resend of it has done its sending (a resend still waiting
            # for a daemon holds no peer): a resend that has sent but not yet returned must not
            # keep a request whose connection drops at once from going again.
            if entry.resends_left > 0:
                entry.resends_left -= 1
                entry.resend = asyncio.ensure_future(self._deliver(rid, entry))
                entry.resend.add_done_callback(consume)

    def _task_done(self, task: asyncio.Task) -> None:
        """Discovery ended: past close() that is expected; otherwise the client cannot go on."""
        if self._closed is None and not task.cancelled():
            self._fail(f"this AsyncJevClient stopped: its discovery failed ({task.exception()!r})")

    def _fail(self, why: str) -> None:
        """No reply can reach a call any more: every call is refused from now on."""
        self._closed = why
        for entry in self._awaited.values():
            if not entry.future.done():
                entry.future.set_result(CLOSED)
        self._fail_backlog()
