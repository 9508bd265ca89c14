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
daemon's queue at once, and the body is read only while one of those slots
is free, so a body of any length costs in_flight requests and one line; a
line is at most --max-message-bytes (a longer one is that item's error, its
bytes dropped as they pass); a call carries at most MAX_ITEMS items. The
items share the queue and its batches with every other caller. A reader
that falls behind holds back its own stream (the answers it has not read
wait in the gateway, in_flight at most), never a worker: a worker's batch is
answered and done before its answers are written out; one that takes no
answer for SEND_STALL_S loses its stream.
"""
import asyncio
import json
import logging
from contextlib import aclosing

from fastapi.responses import Response
from pydantic import ValidationError

from jevany_client.errors import InvalidRequestError, JevanyError
from jevany_client.streaming import as_they_finish

from jevany_daemon.server.logs import event

from .dialects import answer_body
from .guard import count_problem
from .replies import STATUS
from .shapes import SystemOneRequest

MAX_ITEMS = 100_000
DEFAULT_IN_FLIGHT = 32
MAX_IN_FLIGHT = 256
MEDIA_TYPE = "application/x-ndjson"
SEND_STALL_S = 60.0     # a reader that takes no answer for this long loses its stream
log = logging.getLogger("jevany.gateway")


class BulkStream(Response):
    """The bulk route's response: reads the request body itself, as it writes the answers."""

    media_type = MEDIA_TYPE

    def __init__(self, decide, dialect: str, max_line: int, in_flight: int):
        super().__init__(status_code=200)
        # No Content-Length (Response's would say 0): the answers go out chunked, as they finish.
        self.raw_headers = [(b"content-type", MEDIA_TYPE.encode())]
        self.decide, self.dialect, self.max_line, self.in_flight = decide, dialect, max_line, in_flight

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        reading = Reading()
        counts = {"items": 0, "answered": 0, "failed": 0}
        outcomes = as_they_finish(reading.items(_lines(receive, self.max_line)), self.in_flight, self.decide)
        async with aclosing(outcomes):
            async for index, outcome in outcomes:
                line = {"index": index}
                if index in reading.ids:
                    line["id"] = reading.ids.pop(index)
                if isinstance(outcome, JevanyError):
                    line["error"] = {"code": outcome.code, "status": STATUS.get(outcome.code, 500),
                                     "message": outcome.message}
                    counts["failed"] += 1
                else:
                    line["answer"] = answer_body(outcome, self.dialect, additions=False)
                    counts["answered"] += 1
                counts["items"] += 1
                try:
                    await asyncio.wait_for(send({"type": "http.response.body", "body": _line(line),
                                                 "more_body": True}), SEND_STALL_S)
                except asyncio.TimeoutError:
                    # A reader that takes nothing for this long loses its stream (and its items in flight),
                    # so it cannot hold a connection and in_flight answers for ever.
                    event(log, "bulk_dropped", level=logging.WARNING, why="its reader took nothing",
                          stalled_s=SEND_STALL_S, answered=counts["items"] - 1)
                    return
        ending = {"done": True}
        if reading.over:
            ending = {"done": False, "error": {"code": "invalid_request", "status": 413, "message":
                                               f"a bulk call carries at most {MAX_ITEMS:,} items; the rest "
                                               "of the body was not read"}}
        await send({"type": "http.response.body", "body": _line({**ending, **counts}), "more_body": False})


def _line(value: dict) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode() + b"\n"


async def _lines(receive, max_line: int):
    """The body's lines as they arrive; a line past max_line is an InvalidRequestError in its place,
    its bytes dropped, never gathered."""
    held, dropping = bytearray(), False
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk, more = message.get("body", b""), message.get("more_body", False)
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            if dropping or len(held) + end - start > max_line:
                dropping = False
                yield InvalidRequestError(_too_long(max_line))
            else:
                held += chunk[start:end]
                yield bytes(held)
            held.clear()
            start = end + 1
        if not dropping:
            held += chunk[start:]
            if len(held) > max_line:
                dropping = True
                held.clear()
    if dropping:
        yield InvalidRequestError(_too_long(max_line))
    elif held.strip():
        yield bytes(held)


def _too_long(limit: int) -> str:
    return f"the line is longer than {limit:,} bytes, the daemon's --max-message-bytes"


class Reading:
    """What reading a bulk body keeps: the ids of items not answered yet, whether it stopped at MAX_ITEMS."""

    def __init__(self):
        self.ids: dict[int, object] = {}
        self.over = False

    async def items(self, lines):
        """Each item line as the decide body it asks for, or the InvalidRequestError that says why not;
        a line of shared questions (no state) is kept for the item lines after it."""
        shared: dict = {}
        count = 0
        async for raw in lines:
            if isinstance(raw, Exception):
                body = raw
            else:
                if not raw.strip():
                    continue
                try:
                    value = _parse(raw)
                except InvalidRequestError as exc:
                    value = exc
                if isinstance(value, dict) and "state" not in value:
                    shared = {key: value[key] for key in ("questions", "model") if key in value}
                    if shared:
                        continue
                    value = InvalidRequestError("a line without a state must give shared questions (and a "
                                                "model, if any)")
                body = value if isinstance(value, Exception) else self._body({**shared, **value}, count)
            if count == MAX_ITEMS:
                self.over = True       # the items read so far are answered; the rest is not read
                return
            count += 1
            yield body

    def _body(self, value: dict, index: int):
        if "id" in value:
            self.ids[index] = value.pop("id")
        try:
            request = SystemOneRequest.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            return InvalidRequestError(f"{where}: {first['msg']}" if where else first["msg"])
        unsupported = request.unsupported()
        if unsupported is not None:
            return InvalidRequestError(unsupported[2])
        return request.to_body()


def _parse(raw: bytes):
    problem = count_problem(raw)
    if problem is not None:
        raise InvalidRequestError(problem)
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"the line is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError("each line is a JSON object")
    return value

