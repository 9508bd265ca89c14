"""What every HTTP request passes before the routes see it: the token, then the body's size and counts.

FastAPI reads and parses a body before any dependency runs, so the token
dependency came too late: a 315 MB body without a token was read and parsed
(954 MB at the gateway's peak) before its 401, and with a token a 105 MB one
got its 413 only after parsing. This middleware runs ahead of FastAPI's
routes (create_app adds it, inside CORS), in the daemon's gateway and in an
embedded app alike:

- refuses a request that sends Content-Type, Content-Length,
  Content-Encoding, Transfer-Encoding or Authorization twice (400): what is
  checked here and what the framework parses must be the same value;
- answers 401 from the headers alone, the body unread, wherever the token is
  required (everywhere but /health and the API description);
- answers 413 for a declared Content-Length past --max-message-bytes at once,
  and for a streamed body as soon as it passes it, never buffering more;
- holds at most BODY_BUDGET_MESSAGES bodies of --max-message-bytes across
  requests, and at most CLIENT_SHARE_MESSAGES of them for one client (its
  address as the server names it; the daemon's gateway turns uvicorn's
  proxy headers off, so no header chooses it), else 429 with Retry-After:
  a thousand concurrent 8 MB bodies are not 8 GB of gateway. A body counts
  the bytes it has sent, not those it declared, so bodies that declare much
  and send little hold only that little (eight of them, each declaring
  8 MiB and sending a byte every 5 s, kept every other POST out when
  declared bytes counted); a compressed body counts as sent, then as
  decoded; a bulk call, which reads its body as it goes, counts
  BULK_RESERVE_MESSAGES bodies while it runs;
- answers 408 to a body that falls behind MIN_BODY_RATE bytes a second
  once BODY_GRACE_S have passed (it must have sent MIN_BODY_RATE times the
  seconds since then), as Apache's MinRate does: a body trickled a byte at
  a time holds a connection and a coroutine for seconds, not the minute
  connections.py allows a whole body;
- decodes a compressed body (Content-Encoding zstd or gzip, encodings.py)
  to at most --max-message-bytes, so the routes see it plain;
- splits a multipart body (typesafe-sdk's images as assets) on
  /v1/systemone into its JSON and its images (assets.py), a typed 422
  elsewhere;
- counts a JSON body's maps, arrays and values before it is parsed, and
  refuses past the daemon's own caps (protocol.py) with its 422: a body of
  2.7 million empty maps would cost seconds of the gateway's one event loop;
- makes a redirect's Location a path, so the Host header a client sent is
  never echoed back.

Each refusal closes the connection: the rest of an unread body is not worth
reading.
"""
import asyncio
import hmac
import json
import re

from jevany_client.errors import InvalidRequestError
from jevany_client.protocol import MAX_CONTAINERS, MAX_VALUES

from . import assets
from .dialects import OPENAI, error_body, error_status
from .encodings import BodyEncodingError, decode
from .paths import BULK_PATH, DECISIONS_PATH, SYSTEMONE_PATH
from .replies import ERROR_CODE_HEADER, RETRY_AFTER_S
from .shapes import ASSETS_HERE

PUBLIC_PATHS = frozenset(("/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"))
BODY_BUDGET_MESSAGES = 8        # bodies of --max-message-bytes the gateway may hold at once
CLIENT_SHARE_MESSAGES = 4       # of them, what one client (one address) may hold: others keep the rest
BULK_RESERVE_MESSAGES = 3       # of them, a bulk call's: the body read ahead, the line it reads, the lines in flight
BODY_GRACE_S = 5.0              # a body's first seconds, before its rate is judged
MIN_BODY_RATE = 1024            # bytes a second a body must keep up after that (Apache's MinRate is 500)
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


class RequestGuard:
    def __init__(self, app, token: str | None, max_body_bytes: int, dialect: str = "jevany"):
        self.app, self.token, self.max_body, self.dialect = app, token, max_body_bytes, dialect
        self.budget = max_body_bytes * BODY_BUDGET_MESSAGES
        self.share = max_body_bytes * CLIENT_SHARE_MESSAGES
        self.holding = 0
        self.by_client: dict = {}       # address → bytes its requests hold; none once they hold nothing

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        dialect = dialect_for(scope, self.dialect)
        twice = _repeated(scope["headers"])
        if twice:
            # The checks here read one value and the framework another (the last, the first): a JSON
            # body declared text/plain last would be parsed unchecked.
            return await _refuse(send, dialect, 400, "invalid_request", f"the request has more than one "
                                 f"{twice} header; send it once")
        if self.token is not None and _route_path(scope) not in PUBLIC_PATHS and not self._authorized(headers):
            return await _refuse(send, dialect, 401, "unauthorized", "a valid 'Authorization: Bearer TOKEN' header is "
                                 "required", {b"www-authenticate": b"Bearer"})
        encoded = headers.get(b"content-encoding", b"").strip().lower() not in (b"", b"identity")
        held = _Held(self, _client(scope))
        if _route_path(scope) == BULK_PATH:
            # Read by the route as it arrives, a line at a time, never gathered here; what it may hold
            # (a line being read, the lines in flight: bulk.py) is reserved for as long as it runs.
            if encoded:
                return await _refuse(send, dialect, 415, "invalid_request", "a bulk body is read as it arrives, "
                                     "line by line: send it uncompressed")
            if not held.take(BULK_RESERVE_MESSAGES * self.max_body):
                return await self._busy(send, dialect)
            try:
                return await self.app(scope, receive, _local_redirects(send))
            finally:
                held.release()
        declared = _content_length(headers)
        if declared is not None and declared > self.max_body:
            return await _refuse(send, dialect, 413, "invalid_request", _too_large(declared, self.max_body))
        if not _has_body(scope, headers, declared):
            return await self.app(scope, receive, _local_redirects(send))
        if held.full():
            return await self._busy(send, dialect)
        try:
            body = await self._read(receive, held)
            if not isinstance(body, bytes):
                held.release()      # let go before the refusal is written, which may wait on the client
            if body is _GONE:
                return              # nobody to answer, and half a body is not worth parsing
            if body is _BUSY:
                return await self._busy(send, dialect)
            if body is _SLOW:
                return await _refuse(send, dialect, 408, "timeout", f"the request body came slower than "
                                     f"{MIN_BODY_RATE:,} bytes a second after its first {BODY_GRACE_S:g} s")
            if body is None:
                return await _refuse(send, dialect, 413, "invalid_request", _too_large(None, self.max_body))
            if encoded:
                try:
                    body = decode(body, headers[b"content-encoding"].decode("latin-1"), self.max_body)
                except BodyEncodingError as exc:
                    return await _refuse(send, dialect, exc.status, "invalid_request", str(exc))
                # Held from now on: the decoded body (the compressed one is let go), if the budget has room.
                if not held.resize(len(body)):
                    return await self._busy(send, dialect)
                scope = _decoded_scope(scope, len(body))
            if _is_multipart(headers):
                if _route_path(scope) != SYSTEMONE_PATH:
                    return await _refuse(send, dialect, 422, "unsupported_media", ASSETS_HERE)
                try:
                    body, parts = assets.split(body, headers[b"content-type"].decode("latin-1"))
                except InvalidRequestError as exc:
                    return await _refuse(send, dialect, 422, "invalid_request", exc.message)
                # The route reads the JSON; the images ride along in the scope (assets.py).
                scope = {**_as_json(scope, len(body)), assets.SCOPE_KEY: parts}
                headers = dict(scope["headers"])
            elif b"content-type" not in headers:
                # Many callers (curl --data-binary, plain HTTP libraries) send JSON and name no type;
                # every body route here takes JSON, so it is read as JSON instead of failing as a string.
                scope = _as_json(scope, len(body))
                headers = dict(scope["headers"])
            elif not _is_json(headers):
                return await _refuse(send, dialect, 422, "invalid_request", _NOT_JSON.format(
                    headers[b"content-type"].decode("latin-1")))
            problem = count_problem(body)
            if problem is not None:
                return await _refuse(send, dialect, 422, "invalid_request", problem)
            return await self.app(scope, _replay(body, receive), _local_redirects(send))
        finally:
            held.release()

    async def _busy(self, send, dialect: str) -> None:
        await _refuse(send, dialect, 429, "overloaded", "the HTTP gateway holds as many request bodies as it may "
                      "(for everyone, or for this client); retry later", {b"retry-after": RETRY_AFTER_S.encode()})

    def _authorized(self, headers: dict) -> bool:
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())

    async def _read(self, receive, held: "_Held"):
        """The whole body, held as it comes; None as soon as it passes the limit, _BUSY once the budget
        or the client's share has no room for what came, _SLOW once it falls behind MIN_BODY_RATE,
        _GONE if the client went away before it ended (what was read is let go)."""
        chunks, size = [], 0
        started = asyncio.get_running_loop().time()
        while True:
            try:
                # A message already there is taken whatever the time (receive returns without waiting).
                async with asyncio.timeout_at(started + BODY_GRACE_S + size / MIN_BODY_RATE):
                    message = await receive()
            except TimeoutError:
                return _SLOW
            if message["type"] == "http.disconnect":
                return _GONE
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            if not held.take(len(chunk)):
                return _BUSY
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


class _Held:
    """What one request holds of its guard's budget and of its client's share, in bytes."""

    def __init__(self, guard: RequestGuard, client):
        self.guard, self.client, self.size = guard, client, 0

    def full(self) -> bool:
        """Whether the budget, or the client's share, is already spent: a body now would be refused."""
        guard = self.guard
        return guard.holding >= guard.budget or guard.by_client.get(self.client, 0) >= guard.share

    def take(self, size: int) -> bool:
        guard = self.guard
        if guard.holding + size > guard.budget or guard.by_client.get(self.client, 0) + size > guard.share:
            return False
        guard.holding += size
        guard.by_client[self.client] = guard.by_client.get(self.client, 0) + size
        self.size += size
        return True

    def resize(self, size: int) -> bool:
        if size > self.size:
            return self.take(size - self.size)
        self._give(self.size - size)
        return True

    def release(self) -> None:
        self._give(self.size)

    def _give(self, size: int) -> None:
        guard = self.guard
        guard.holding -= size
        self.size -= size
        left = guard.by_client.get(self.client, 0) - size
        if left > 0:
            guard.by_client[self.client] = left
        else:
            guard.by_client.pop(self.client, None)


_BUSY, _SLOW, _GONE = object(), object(), object()    # why _read gave up (None: a body past the limit)


def _client(scope):
    """Who a request's bytes are counted against: its peer's address (uvicorn's proxy headers are off in
    the daemon's gateway, so a header cannot choose it); None where the server names no peer."""
    client = scope.get("client")
    return client[0] if client else None


def dialect_for(scope, dialect: str) -> str:
    """How a request's errors are written: OpenAI's envelope on /v1/decisions, else the dialect's."""
    return OPENAI if _route_path(scope) == DECISIONS_PATH else dialect


SINGLE_HEADERS = (b"content-type", b"content-length", b"content-encoding", b"transfer-encoding",
                  b"authorization")


def _repeated(raw_headers) -> str | None:
    """The first header of SINGLE_HEADERS the request sends more than once, by name; None if none is."""
    seen = set()
    for name, _ in raw_headers:
        name = name.lower()
        if name in SINGLE_HEADERS:
            if name in seen:
                return name.decode().title()
            seen.add(name)
    return None


def _content_length(headers: dict) -> int | None:
    raw = headers.get(b"content-length")
    return int(raw) if raw is not None and raw.strip().isdigit() else None


def _has_body(scope, headers: dict, declared: int | None) -> bool:
    return scope["method"] in ("POST", "PUT", "PATCH") or b"transfer-encoding" in headers or bool(declared)


_NOT_JSON = ("the body must be JSON, sent with 'Content-Type: application/json' (or multipart/form-data "
             "with images), got Content-Type {!r}")


def _is_multipart(headers: dict) -> bool:
    return headers.get(b"content-type", b"").split(b";")[0].strip().lower() == b"multipart/form-data"


def _as_json(scope, size: int):
    """The request as the routes see it with its body read as JSON: the JSON part taken out of a
    multipart body, or a body sent with no type."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-type", b"content-length")]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json"),
                                 (b"content-length", str(size).encode())]}


def _decoded_scope(scope, size: int):
    """The request as the routes see it once decoded: no Content-Encoding, the decoded length."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-encoding", b"content-length")]
    return {**scope, "headers": [*headers, (b"content-length", str(size).encode())]}


def _is_json(headers: dict) -> bool:
    kind = headers.get(b"content-type", b"application/json").split(b";")[0].strip().lower()
    return kind == b"application/json" or kind.endswith(b"+json")


def count_problem(body: bytes) -> str | None:
    """The daemon's caps on values and containers, checked on the JSON text before anything parses it.

    Brackets and commas count containers and values from above; only when that bound is over a
    cap are the strings taken out (where brackets and commas may stand for themselves) and the
    count made exact.
    """
    containers = body.count(b"{") + body.count(b"[")
    values = body.count(b",") + containers
    if containers <= MAX_CONTAINERS and values <= MAX_VALUES:
        return None
    bare = _STRINGS.sub(b'""', body)
    containers = bare.count(b"{") + bare.count(b"[")
    values = bare.count(b",") + containers
    if containers <= MAX_CONTAINERS and values <= MAX_VALUES:
        return None
    return (f"the body holds more than {MAX_VALUES:,} values or {MAX_CONTAINERS:,} objects and arrays; "
            "no decision request needs that many")


def _too_large(size: int | None, limit: int) -> str:
    what = f"the request body is {size:,} bytes" if size is not None else "the request body is bigger than that"
    return f"{what}; the daemon accepts at most {limit:,} (its --max-message-bytes, JEVANY_MAX_MESSAGE_BYTES)"


def _replay(body: bytes, receive):
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()      # after the body: only a disconnect can come

    return replayed


def _local_redirects(send):
    """Starlette builds a redirect's Location from the request's Host header; keep only its path."""
    async def sending(message):
        if message["type"] == "http.response.start" and 300 <= message["status"] < 400:
            message = {**message, "headers": [(k, _path_only(v) if k.lower() == b"location" else v)
                                              for k, v in message.get("headers", [])]}
        await send(message)
    return sending


def _path_only(location: bytes) -> bytes:
    match = re.match(rb"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*", location)
    rest = location[match.end():] if match else location
    return b"/" + rest.lstrip(b"/\\")      # one slash: "//host" would name a host again


def _route_path(scope) -> str:
    """The path as the routes match it: without the prefix an app mounted under one, or served with
    --root-path, is reached by (Starlette strips it the same way)."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("", "/"):
        return path[len(root):] or "/"
    return path


async def _refuse(send, dialect: str, status: int, code: str, message: str, extra: dict | None = None) -> None:
    status = error_status(dialect, code, status)
    body = json.dumps(error_body(dialect, status, code, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (ERROR_CODE_HEADER.lower().encode(), code.encode()), (b"connection", b"close"),
               *(extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
