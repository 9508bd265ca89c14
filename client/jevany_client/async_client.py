"""AsyncJevClient: JevClient for asyncio, with many calls in flight over one DEALER socket."""

import asyncio
import os
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any

import zmq
import zmq.asyncio

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

__all__ = ["AsyncJevClient"]

_CLOSED = object()    # what a pending call's future holds when the client was closed under it


class _Awaited:
    """One request sent (or being sent) whose reply has not come yet."""

    __slots__ = ("future", "payload", "resends_left", "sent", "resend", "unattributed")

    def __init__(self, future: asyncio.Future, payload: bytes, resends: int) -> None:
        self.future = future
        self.payload = payload
        self.resends_left = resends
        self.sent = False
        self.resend: asyncio.Future | None = None     # a send again after a connection dropped
        self.unattributed: JevanyError | None = None  # an error reply no id could be read from


class AsyncJevClient(ClientOptions):
    """JevClient for asyncio: `await client.decide(...)`, any number of calls at once.

    Every call of every task goes over one ZeroMQ DEALER socket; one reader
    task hands each reply to the call that awaits its id. The endpoints,
    CurveZMQ keys, `timeout`, `retries` (with their pause that doubles from
    50 ms) and typed errors are JevClient's, and so are the methods, as
    coroutines.

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
    ) -> None:
        super().__init__(endpoint, timeout, retries, server_public_key, client_secret_key_file,
                         client_public_key, client_secret_key)
        if context is not None and not isinstance(context, zmq.asyncio.Context):
            context = zmq.asyncio.Context.shadow(context)    # same I/O threads, asyncio sockets
        self._context = context
        self._socket: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None      # the socket's connection events
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None
        self._awaited: dict[str, _Awaited] = {}
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
    ) -> dict:
        """Ask one decision; returns the reply's `result` (PROTOCOL.md "decide result")."""
        body = decide_body(state, questions, model, media)
        return await self._call("decide", body, self._wait(timeout), REMAINING)

    async def decide_request(self, body: Mapping[str, Any], timeout: float | None = None) -> dict:
        """Ask one decision given as its body (decide_body()'s, or a suite line's); returns its result."""
        return await self._call("decide", as_wire_body(body), self._wait(timeout), REMAINING)

    async def decide_many(
        self,
        requests: Iterable[dict],
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list:
        """JevClient.decide_many, awaited: many bodies, results in request order."""
        bodies = [as_wire_body(body) for body in requests]
        results = await self._run(self._tries("decide", bodies, self._wait(timeout), REMAINING,
                                              raise_unsendable=not return_exceptions))
        if not return_exceptions:
            raise_first_error(results)
        return results

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
                entry.future.set_result(_CLOSED)
        tasks, self._tasks = self._tasks, []
        sock, monitor, self._socket, self._monitor = self._socket, self._monitor, None, None
        if sock is None or self._pid != os.getpid():
            return      # never opened, or the parent's socket after a fork: not ours to close
        for task in tasks:
            task.cancel()
        if self._loop is _running_loop():
            await asyncio.gather(*tasks, return_exceptions=True)
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)

    # -- one call ------------------------------------------------------------------

    async def _call(self, op: str, body: dict | None, wait: float | None, timeout_ms) -> dict:
        [outcome] = await self._run(self._tries(op, [body], wait, timeout_ms, raise_unsendable=True))
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
        sock = self._socket_for_caller()
        loop = asyncio.get_running_loop()
        entries = {rid: _Awaited(loop.create_future(), payload, step.resends)
                   for rid, payload in step.requests}
        self._awaited.update(entries)
        try:
            async with asyncio.timeout(step.wait):
                for entry in entries.values():
                    await self._send(sock, entry.payload)
                    entry.sent = True
                await asyncio.wait([entry.future for entry in entries.values()])
        except TimeoutError:
            pass    # what is still awaited times out below
        finally:
            # Cancelled or not, from here on a reply to these ids is discarded.
            for rid, entry in entries.items():
                self._forget(rid, entry)
        if any(entry.future.done() and entry.future.result() is _CLOSED for entry in entries.values()):
            raise RuntimeError(self._closed)
        where = ", ".join(self.endpoints)
        return {rid: entry.future.result() if entry.future.done()
                else timeout_error(step, where, rid, entry.sent, entry.unattributed)
                for rid, entry in entries.items()}

    async def _send(self, sock: zmq.asyncio.Socket, payload: bytes) -> None:
        if self._closed is not None:
            raise RuntimeError(self._closed)
        try:
            await sock.send(payload)    # waits while no daemon is connected, or the queue is full
        except asyncio.CancelledError:
            # Closing the socket cancels the sends it holds; only a cancelled task is cancelled.
            if self._closed is not None and not asyncio.current_task().cancelling():
                raise RuntimeError(self._closed) from None
            raise

    def _forget(self, rid: str, entry: _Awaited) -> None:
        if self._awaited.get(rid) is entry:
            del self._awaited[rid]
        if entry.resend is not None:
            entry.resend.cancel()

    # -- the socket and its reader ----------------------------------------------------

    def _socket_for_caller(self) -> zmq.asyncio.Socket:
        if self._closed is not None:
            raise RuntimeError(self._closed)
        loop = asyncio.get_running_loop()
        if self._pid != os.getpid():
            self._open(loop)
        elif loop is not self._loop:
            raise RuntimeError(
                "this AsyncJevClient belongs to another event loop; create one AsyncJevClient per loop"
            )
        return self._socket

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._pid is not None:
            # Forked: the inherited socket, context, tasks and calls are the parent's.
            # Drop them without closing anything.
            self._context = None
            self._awaited = {}
            self._new_id_space()
        context = zmq.asyncio.Context.instance() if self._context is None else self._context
        self._socket = connect(context, self.endpoints, self._curve)
        self._monitor = self._socket.get_monitor_socket(DROP_EVENTS)
        self._context, self._loop, self._pid = context, loop, os.getpid()
        self._tasks = [loop.create_task(self._read_replies(self._socket)),
                       loop.create_task(self._watch_disconnects(self._monitor))]
        for task in self._tasks:
            task.add_done_callback(self._task_done)

    async def _read_replies(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart()
            self._settle(*read_reply(frames[-1]))

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
        if entry.resend is not None:
            entry.resend.cancel()

    async def _watch_disconnects(self, monitor: zmq.asyncio.Socket) -> None:
        loop = asyncio.get_running_loop()
        drops = Drops()
        while True:
            try:
                async with asyncio.timeout(drops.wait_s(loop.time())):
                    frames = await monitor.recv_multipart()
            except TimeoutError:
                frames = None
            if drops.note(frames, loop.time()):
                retire_dropped_pipes(self._socket)
                self._send_again()

    def _send_again(self) -> None:
        """A connection dropped: whatever it carried will never be answered, so send what
        is still awaited once more (it may have gone to a daemon that is fine; the
        duplicate reply is discarded)."""
        for entry in self._awaited.values():
            idle = entry.resend is None or entry.resend.done()
            if entry.sent and idle and entry.resends_left > 0:
                entry.resends_left -= 1
                entry.resend = asyncio.ensure_future(self._socket.send(entry.payload))
                entry.resend.add_done_callback(_consume)

    def _task_done(self, task: asyncio.Task) -> None:
        """The reader or the watcher ended: past close() that is expected; otherwise no
        reply could reach a call any more, so every call is refused from now on."""
        if self._closed is not None or task.cancelled():
            return
        self._closed = f"this AsyncJevClient stopped: its socket failed ({task.exception()!r})"
        for entry in self._awaited.values():
            if not entry.future.done():
                entry.future.set_result(_CLOSED)


def _consume(future: asyncio.Future) -> None:
    # A resend that failed or was cancelled needs no one's attention; its call times out.
    if not future.cancelled():
        future.exception()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
