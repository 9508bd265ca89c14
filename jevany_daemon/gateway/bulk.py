"""POST /v1/systemone/bulk: many requests in one HTTP call, each answer streamed back as it finishes.

The body is JSON lines (application/x-ndjson), read as it arrives:

    {"questions": {...}, "model": "jev-latest"}           shared: the lines after it that have none take these
    {"id": "a-1", "state": "..."}                          an item: /v1/systemone's body, plus an optional id
    {"state": {...}, "questions": {...}}                   an item with questions of its own

The response is JSON lines too, one per item in the order the items finish
(not the order they were sent; each names its index, counted from 0 over
the item lines, and its id when it had one), then one closing line:

    {"index": 3, "id": "a-4", "answer": {...}}             the answer /v1/systemone gives (the dialect's)
    {"index": 0, "id": "a-1", "error": {"code", "status", "message"}}
    {"done": true, "items": 2, "answered": 1, "failed": 1}
    {"done": false, ..., "error": {...}}                   the stream stopped early (too many items)

Bounded: at most `in_flight` items (?in_flight=N, 32 by default) are in the
daemon's queue at once, their lines together at most --max-message-bytes
(one longer item goes alone), and the body is read only while there is room,
so a body of any length costs the gateway three messages' bytes (read
ahead, the line being read, the lines in flight; the guard reserves them
from its budget for the call); a line is at most
--max-message-bytes (a longer one is that item's error, its bytes dropped as
they pass); a call is at most MAX_LINES lines. The items share the queue and
its batches with every other caller. A reader that falls behind holds back
its own stream (the answers it has not read wait in the gateway, in_flight
at most), never a worker: a worker's batch is answered and done before its
answers are written out. A body that sends nothing for STALL_S while the
route waits on it ends the call (done: false), as does a reader that takes
no answer for STALL_S; a client that goes away stops its items being sent.
"""
import asyncio
import json
import logging
from collections import deque
from contextlib import aclosing

from fastapi.responses import Response
from pydantic import ValidationError

from jevany_client.errors import InvalidRequestError, JevanyError
from jevany_client.streaming import as_they_finish

from jevany_daemon.logs import event

from .dialects import answer_body, error_status
from .guard import count_problem
from .replies import STATUS
from .shapes import SystemOneRequest

MAX_LINES = 100_000
DEFAULT_IN_FLIGHT = 32
MAX_IN_FLIGHT = 256
MEDIA_TYPE = "application/x-ndjson"
STALL_S = 60.0          # a body that sends nothing, or a reader that takes nothing, for this long ends the call
log = logging.getLogger("jevany.gateway")


class BulkStream(Response):
    """The bulk route's response: reads the request body itself, as it writes the answers."""

    media_type = MEDIA_TYPE

    def __init__(self, decide, dialect: str, max_line: int, in_flight: int):
        super().__init__(status_code=200)
        # No Content-Length (Response's would say 0): the answers go out chunked, as they finish. The
        # connection closes after: a call that stopped early leaves its body unread.
        self.raw_headers = [(b"content-type", MEDIA_TYPE.encode()), (b"connection", b"close")]
        self.decide, self.dialect, self.max_line, self.in_flight = decide, dialect, max_line, in_flight

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        reading = Reading(receive, self.max_line)
        counts = {"items": 0, "answered": 0, "failed": 0}
        ending: dict = {"done": True}
        outcomes = as_they_finish(reading.items(), self.in_flight, reading.sized(self.decide))
        try:
            async with aclosing(outcomes):
                async for index, outcome in outcomes:
                    if reading.gone.is_set():
                        return          # nobody reads on: what is in flight is cancelled, nothing more sent
                    counts["items"] += 1
                    if not await self._write(send, self._line(reading, index, outcome, counts)):
                        event(log, "bulk_dropped", level=logging.WARNING, why="its reader took nothing",
                              stalled_s=STALL_S, answered=counts["items"] - 1)
                        return
        except Exception as exc:      # a fault of ours: said on the stream, whose status is already sent
            ending = _stopped(f"the call failed: {type(exc).__name__}: {exc}", "internal")
            event(log, "bulk_failed", level=logging.ERROR, error=f"{type(exc).__name__}: {exc}")
        finally:
            reading.close()
        if reading.over:
            ending = _stopped(f"a bulk call is at most {MAX_LINES:,} lines; the rest of the body was not read",
                              status=413)
        elif reading.stalled:
            ending = _stopped(f"the body sent nothing for {STALL_S:g} s; the items read before were answered")
        await self._write(send, {**ending, **counts}, last=True)

    def _line(self, reading: "Reading", index: int, outcome, counts: dict) -> dict:
        line = {"index": index}
        if index in reading.ids:
            line["id"] = reading.ids.pop(index)
        if isinstance(outcome, JevanyError):
            status = error_status(self.dialect, outcome.code, STATUS.get(outcome.code, 500))
            line["error"] = {"code": outcome.code, "status": status, "message": outcome.message}
            counts["failed"] += 1
        else:
            line["answer"] = answer_body(outcome, self.dialect, additions=False)
            counts["answered"] += 1
        return line

    @staticmethod
    async def _write(send, line: dict, last: bool = False) -> bool:
        """Send one line; False when the reader took nothing for STALL_S (so it cannot hold a connection
        and in_flight answers for ever)."""
        body = json.dumps(line, ensure_ascii=False, allow_nan=False).encode() + b"\n"
        try:
            await asyncio.wait_for(send({"type": "http.response.body", "body": body, "more_body": not last}),
                                   STALL_S)
            return True
        except asyncio.TimeoutError:
            return False


def _stopped(message: str, code: str = "invalid_request", status: int = 400) -> dict:
    return {"done": False, "error": {"code": code, "status": 500 if code == "internal" else status,
                                     "message": message}}


class Reading:
    """Reading one bulk body: its lines as they arrive, the ids of items not answered yet, the bytes of
    the lines in flight, and whether the client went away or the body passed MAX_LINES."""

    def __init__(self, receive, max_line: int):
        self.receive, self.max_line = receive, max_line
        self.ids: dict[int, object] = {}
        self.over = False
        self.stalled = False                  # the body sent nothing for STALL_S while the route waited
        self.gone = asyncio.Event()           # the client disconnected
        self.room = asyncio.Condition()
        self.in_flight_bytes = 0
        self.watcher: asyncio.Task | None = None   # the pump, reading the body ahead
        self.arrived = asyncio.Condition()
        self.ahead: deque[bytes] = deque()          # chunks read, their lines not yet taken
        self.ahead_bytes = 0
        self.body_done = False

    def sized(self, decide):
        """decide for (size, body) items: the line's bytes count as in flight until its answer is in."""
        async def call(item):
            size, body = item
            try:
                return await decide(body)
            finally:
                async with self.room:
                    self.in_flight_bytes -= size
                    self.room.notify_all()
        return call

    async def items(self):
        """(size, decide body) for each item line, or the InvalidRequestError that says why not; a line
        of shared questions (no state) sets them for the item lines after it."""
        shared: dict = {}
        count = lines = 0
        async for raw in self._lines():
            if self.gone.is_set():
                return
            lines += 1
            if lines > MAX_LINES:
                self.over = True       # the items read so far are answered; the rest is not read
                return
            if isinstance(raw, Exception):
                yield raw
                count += 1
                continue
            if not raw.strip():
                continue
            try:
                value = _parse(raw)
            except InvalidRequestError as exc:
                value = exc
            if isinstance(value, dict) and "state" not in value:
                given = {key: value[key] for key in ("questions", "model") if key in value}
                if given:
                    shared |= given
                    continue
                value = InvalidRequestError("a line without a state gives shared questions or a model")
            item = value if isinstance(value, Exception) else self._body({**shared, **value}, count)
            count += 1
            if isinstance(item, Exception):
                yield item
                continue
            async with self.room:      # the lines in flight stay within one message's bytes (one alone may pass)
                await self.room.wait_for(lambda: self.in_flight_bytes == 0
                                         or self.in_flight_bytes + len(raw) <= self.max_line)
                self.in_flight_bytes += len(raw)
            yield len(raw), item

    def _body(self, value: dict, index: int):
        if "id" in value:
            self.ids[index] = value.pop("id")
        try:
            request = SystemOneRequest.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            return InvalidRequestError(f"{where}: {first['msg']}" if where else first["msg"])
        try:
            return request.to_body()      # a box question, or assets (one request each, on /v1/systemone)
        except ValueError as exc:
            return InvalidRequestError(str(exc))

    async def _lines(self):
        """The body's lines as they arrive; a line past max_line is an InvalidRequestError in its place,
        its bytes dropped, never gathered."""
        held, dropping = bytearray(), False
        self.watcher = asyncio.ensure_future(self._pump())
        while True:
            chunk = await self._next_chunk()
            if chunk is None:
                break
            start = 0
            while (end := chunk.find(b"\n", start)) != -1:
                if dropping or len(held) + end - start > self.max_line:
                    dropping = False
                    yield InvalidRequestError(_too_long(self.max_line))
                else:
                    held += chunk[start:end]
                    yield bytes(held)
                held.clear()
                start = end + 1
            if not dropping:
                held += chunk[start:]
                if len(held) > self.max_line:
                    dropping = True
                    held.clear()
        if self.gone.is_set() or self.stalled:
            return
        if dropping:
            yield InvalidRequestError(_too_long(self.max_line))
        elif held.strip():
            yield bytes(held)

    async def _pump(self) -> None:
        """Asks for the body's next message whenever fewer than max_line bytes wait unread, and once
        the body is in, for the one after (which can only say the client went away): a client that
        goes away is seen at once, the server saying so before any body it still holds, not when the
        lines it had sent run out."""
        while True:
            async with self.arrived:
                await self.arrived.wait_for(lambda: self.ahead_bytes < self.max_line)
            message = await self.receive()
            async with self.arrived:
                if message["type"] == "http.disconnect":
                    self.gone.set()
                    self.body_done = True
                elif not self.body_done:
                    chunk = message.get("body", b"")
                    self.ahead.append(chunk)
                    self.ahead_bytes += len(chunk)
                    self.body_done = not message.get("more_body", False)
                self.arrived.notify_all()
            if self.gone.is_set() or message["type"] != "http.request":
                return

    async def _next_chunk(self) -> bytes | None:
        """The next chunk read ahead; None once the body is in (or the client went, or it stalled)."""
        async with self.arrived:
            try:
                await asyncio.wait_for(self.arrived.wait_for(lambda: self.ahead or self.body_done), STALL_S)
            except asyncio.TimeoutError:
                self.stalled = True    # the items read so far are answered; the call ends there
                return None
            if self.gone.is_set() or not self.ahead:
                return None
            chunk = self.ahead.popleft()
            self.ahead_bytes -= len(chunk)
            self.arrived.notify_all()
            return chunk

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()


def _too_long(limit: int) -> str:
    return f"the line is longer than {limit:,} bytes, the daemon's --max-message-bytes"


def _parse(raw: bytes):
    problem = count_problem(raw)
    if problem is not None:
        raise InvalidRequestError(problem)
    try:
        value = json.loads(raw)
    except RecursionError:
        raise InvalidRequestError("the line nests deeper than a JSON parser goes") from None
    except ValueError as exc:
        raise InvalidRequestError(f"the line is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError("each line is a JSON object")
    return value
