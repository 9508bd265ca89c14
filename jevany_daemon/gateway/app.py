"""JevAny's HTTP routes, answered through the supervisor's queue (or, embedded, by a model in this process).

    POST /v1/systemone   a decide request (JevAny's body); its answer in JevAny's shape, or 4xx/5xx with `detail`
    POST /v1/decisions   OpenAI's Decisions API (a preview): the same questions, in its shapes (decisions.py)
    POST /v1/systemone/bulk  many requests as JSON lines; answers streamed back as they finish (bulk.py)
    GET  /v1/models      {"models": [entry]} (the models op's description as JevAny's, media policy in `limits`)
    GET  /health         200 {"status": "ready"}; 503 "loading" (also while every worker is being
                         replaced), "draining" or "unavailable"
    GET  /metrics        the daemon's Prometheus metrics (when --metrics-port is set)
    GET  /openapi.json   the API, described (no /docs: its page loads scripts from a CDN)

Handlers are coroutines: a request costs a future on the event loop while it
waits for the daemon, never a thread.
"""
import asyncio
import math
import urllib.request
from contextlib import asynccontextmanager

from fastapi import FastAPI, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from jevany_client.errors import InvalidRequestError, JevanyError

from jevany_daemon import __version__
from jevany_daemon.http_options import cors_origins

from . import assets
from .bulk import DEFAULT_IN_FLIGHT, MAX_IN_FLIGHT, MEDIA_TYPE, BulkStream
from .decisions import DecisionsRequest, usage as decisions_usage
from .departures import CallerGone, while_connected
from .dialects import OPENAI, answer_body, error_body
from .field_headers import REQUEST_ID_HEADER, FieldHeaders
from .guard import RequestGuard, dialect_for
from .jevany_view import (ADDITIONS_HEADER, BATCH_SIZE_HEADER, PADDED_TOKENS_HEADER, answer_headers, models_body,
                          wants_additions)
from .paths import BULK_PATH, DECISIONS_PATH, SYSTEMONE_PATH
from .replies import ERROR_CODE_HEADER, JEVANY_ERROR_HEADER, TIMEOUT_HEADER, error_response, from_error
from .shapes import SystemOneRequest
from .upstream import TooLarge, Upstream

READY_POLL_S = 0.25       # how often /v1 routes learn, while the model loads, whether it is ready
STATUS_WAIT_S = 5.0       # /health, /v1/models: a daemon that does not answer this fast is unavailable
DECIDE_WAIT_S = 600.0     # without a timeout header, the longest an HTTP caller waits on the daemon
CLIENT_CLOSED = 499       # the status of an answer to a caller who left (nginx's): logged, never read


class Gateway:
    """What the routes share: the upstream socket, whether the model has loaded, the policy."""

    def __init__(self, upstream: Upstream, settings: dict, token: str | None, metrics_url: str | None,
                 uploads: str | None = None):
        self.upstream = upstream
        self.uploads = assets.Uploads(uploads)     # where images sent in a body go while checked (None: media off)
        self.settings = settings
        self.token = token
        self.metrics_url = metrics_url
        self.ready = False        # once ready, a daemon stays so for HTTP (a reload keeps serving)
        self.dialect = settings.get("http_dialect", "jevany")

    async def is_ready(self) -> bool:
        """Whether the model has loaded; asks the daemon until the first yes, then remembers it."""
        if not self.ready:
            try:
                self.note_state((await self.upstream.call("status", wait_s=STATUS_WAIT_S))["state"])
            except JevanyError:
                pass
        return self.ready

    def note_state(self, state: str) -> None:
        self.ready = self.ready or state in ("ready", "draining", "drained")

    async def watch_readiness(self) -> None:
        # Learns the moment of loading in the background, so the first requests after it pay nothing.
        while not await self.is_ready():
            await asyncio.sleep(READY_POLL_S)   # polling a loading model, not standing in for a reply


def create_app(gateway: Gateway) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        gateway.upstream.start()
        watcher = asyncio.get_running_loop().create_task(gateway.watch_readiness())
        try:
            yield
        finally:
            watcher.cancel()
            await gateway.upstream.close()

    app = FastAPI(title="jevany-daemon", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="JevAny's HTTP API: typed questions about a state, answered in one prefill pass. "
                              "HTTP and ZeroMQ callers share one queue and its batches.")
    # The token (on every route but /health and the API description), then the body's size and counts,
    # checked before FastAPI reads a byte of the body (guard.py), in the daemon's gateway and in an
    # embedded app alike; the only token check. Inside CORS (added after, so outside it): a refusal
    # carries CORS's headers, and CORS answers a browser's preflight, which carries no token.
    app.add_middleware(RequestGuard, token=gateway.token, max_body_bytes=gateway.settings["max_message_bytes"],
                       dialect=gateway.dialect)
    # JevAny lets a page from any origin call it (CORSMiddleware, everything allowed); so do we,
    # unless --http-cors-origins narrows it. Our headers are exposed, so a page can read them.
    origins = cors_origins(gateway.settings.get("http_cors_origins", "*"))
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"],
                           expose_headers=[ERROR_CODE_HEADER, JEVANY_ERROR_HEADER, "Retry-After",
                                           BATCH_SIZE_HEADER, PADDED_TOKENS_HEADER, REQUEST_ID_HEADER])
    # Outermost: every response, a refusal or a preflight too, has its request id and, when busy, when to retry.
    app.add_middleware(FieldHeaders, failure=lambda scope: error_body(
        dialect_for(scope, gateway.dialect), 500, "internal", "the gateway failed; the request may not have been "
        "scored"))

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError):
        # The offending input is echoed back; a NaN in it must not break the JSON encoder.
        detail = jsonable_encoder(exc.errors(), custom_encoder={
            float: lambda v: v if math.isfinite(v) else str(v)})
        if dialect_for(request.scope, gateway.dialect) == OPENAI:
            # OpenAI's envelope names one problem: the most specific (a union's deepest member's)
            worst = max(detail, key=lambda d: len(d.get("loc", ())), default={})
            return error_response("invalid_request", worst.get("msg", "invalid request"), OPENAI,
                                  loc=worst.get("loc"))
        return JSONResponse({"detail": detail}, status_code=422, headers={ERROR_CODE_HEADER: "invalid_request"})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # An unknown route or method: the dialect's error body (typesafe: detail.error_type and message).
        code = "not_found" if exc.status_code == 404 else "invalid_request"
        response = error_response(code, str(exc.detail), dialect_for(request.scope, gateway.dialect),
                                  status=exc.status_code)
        response.headers.update(exc.headers or {})
        return response

    async def decide(body: dict, timeout_ms: str | None, dialect: str, receive) -> dict | Response:
        """A decide request through the daemon's queue: its result, or the error response to send (one
        nobody reads if the caller leaves first: its request is then withdrawn, departures.py)."""
        if not await gateway.is_ready():
            return error_response("not_ready", "model is not ready", dialect)
        try:
            timeout = _timeout_ms(timeout_ms)
        except ValueError as exc:
            return error_response("invalid_request", str(exc), dialect)
        wait_s = DECIDE_WAIT_S if timeout is None else timeout / 1000 + DECIDE_WAIT_S
        try:
            return await while_connected(receive, gateway.upstream.call("decide", body, timeout_ms=timeout,
                                                                        wait_s=wait_s))
        except CallerGone:
            return Response(status_code=CLIENT_CLOSED)
        except TooLarge as exc:
            return error_response("invalid_request", str(exc), dialect, status=413)
        except JevanyError as exc:
            return from_error(exc, dialect)

    @app.post(SYSTEMONE_PATH)
    async def systemone(request: SystemOneRequest, http: Request,
                        timeout_ms: str | None = Header(default=None, alias=TIMEOUT_HEADER,
                                                        description="Give up unless scoring begins within "
                                                                    "this many milliseconds (504)."),
                        additions: str | None = Header(default=None, alias=ADDITIONS_HEADER,
                                                       description="1: the answer with our additions (batch, "
                                                                   "noul's probabilities) beside JevAny's fields.")):
        """Typed questions in, typed answers out, one prefill pass (JevAny's route)."""
        if (unsupported := request.unsupported()) is not None:
            code, where, why = unsupported
            return error_response(code, why, gateway.dialect, loc=where)
        uploaded = []
        if request.assets:
            try:
                uploaded = gateway.uploads.place(request.assets, http.scope.get(assets.SCOPE_KEY))
            except InvalidRequestError as exc:
                return error_response(exc.code, exc.message, gateway.dialect, loc=["body", "assets"])
        try:
            result = await decide(request.to_body(uploaded), timeout_ms, gateway.dialect, http.receive)
        finally:
            gateway.uploads.remove(uploaded)       # the worker has its own copy by the time it answers
        if isinstance(result, Response):
            return result
        # Already plain JSON types (msgpack's); straight to the encoder, which refuses NaN.
        return JSONResponse(answer_body(result, gateway.dialect, wants_additions(additions)),
                            headers=answer_headers(result))

    @app.post(DECISIONS_PATH)
    async def decisions(request: DecisionsRequest, http: Request,
                        timeout_ms: str | None = Header(default=None, alias=TIMEOUT_HEADER,
                                                        description="Give up unless scoring begins within "
                                                                    "this many milliseconds (504).")):
        """OpenAI's Decisions API (a preview): the same model, queue and batches as /v1/systemone."""
        if request.images():
            return error_response("unsupported_media", "input_image parts are not served: this daemon reads "
                                  "media by path under its --media-root (JevAny's media entries on "
                                  "/v1/systemone)", OPENAI, loc=["body", "input"])
        result = await decide(request.to_body(), timeout_ms, OPENAI, http.receive)
        if isinstance(result, Response):
            return result
        shown = answer_body(result, gateway.dialect, additions=False)["answers"]
        return JSONResponse({"model": result["model"], "answers": request.answers(result["answers"], shown),
                             "usage": decisions_usage(result)}, headers=answer_headers(result))

    @app.post(BULK_PATH, responses={200: {"description": "JSON lines: each item's answer or error as it "
                                                        "finishes, then a closing line with the counts",
                                         "content": {MEDIA_TYPE: {}}}},
              openapi_extra={"requestBody": {"required": True, "content": {MEDIA_TYPE: {"schema": {
                  "type": "string", "description": "JSON lines: /v1/systemone bodies (with an optional id), "
                                                   "or shared questions for the lines after"}}}}})
    async def bulk(request: Request,
                   in_flight: int = Query(DEFAULT_IN_FLIGHT, ge=1, le=MAX_IN_FLIGHT,
                                          description="Items in the daemon's queue at once, at most.")):
        """Many requests in one call, JSON lines in; each answer (or its own error) streamed back as a JSON
        line as it finishes, then a closing line with the counts (bulk.py)."""
        del request      # the body is read by the response, as it arrives
        if not await gateway.is_ready():
            return error_response("not_ready", "model is not ready", gateway.dialect)

        async def decide_one(body: dict) -> dict:
            try:
                return await gateway.upstream.call("decide", body, wait_s=DECIDE_WAIT_S)
            except TooLarge as exc:
                raise InvalidRequestError(str(exc)) from None

        return BulkStream(decide_one, gateway.dialect, gateway.settings["max_message_bytes"], in_flight)

    @app.get("/v1/models")
    async def models():
        """The loaded model: {"models": [description]}, with the media policy in its limits."""
        if not await gateway.is_ready():
            return error_response("not_ready", "model is not ready", gateway.dialect)
        try:
            return JSONResponse(models_body(await gateway.upstream.call("models", wait_s=STATUS_WAIT_S)))
        except JevanyError as exc:
            return from_error(exc, gateway.dialect)

    @app.get("/health")
    async def health():
        """200 {"status": "ready"} when requests are served; 503 otherwise, with why."""
        try:
            daemon = await gateway.upstream.call("status", wait_s=STATUS_WAIT_S)
            state = daemon["state"]
            gateway.note_state(state)
        except JevanyError:
            state, daemon = "unavailable", {}
        if state == "ready" and not daemon.get("serving", True):
            state = "starting"      # every serving worker died or hung: requests wait for a replacement
        status = {"ready": "ready", "starting": "loading"}.get(state, state)
        if status == "drained":
            status = "draining"
        return JSONResponse({"status": status}, status_code=200 if status == "ready" else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics():
        if gateway.metrics_url is None:
            return error_response("not_found", "metrics are off; start the daemon with --metrics-port",
                                  gateway.dialect)
        try:
            body, content_type = await asyncio.to_thread(_fetch, gateway.metrics_url)
        except OSError as exc:
            return error_response("internal", f"the daemon's metrics could not be read: {exc}", gateway.dialect)
        return Response(body, media_type=content_type)

    return app


def _timeout_ms(raw: str | None) -> int | None:
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit():
        raise ValueError(f"{TIMEOUT_HEADER} must be a whole number of milliseconds, got {raw!r}")
    return int(text)


def _fetch(url: str) -> tuple[bytes, str]:
    with urllib.request.urlopen(url, timeout=STATUS_WAIT_S) as reply:
        return reply.read(), reply.headers.get("Content-Type", "text/plain")
