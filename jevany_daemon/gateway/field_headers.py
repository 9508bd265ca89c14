"""The headers the Jev API's clients read on every response: a request id, and when to retry a busy server.

typesafe-sdk puts `x-typesafe-request-id` into every error it raises, so a
report names the request the server saw; it retries 408, 429 and 5xx after
`retry-after` (or `retry-after-ms`) when given, else after its own backoff.
Added outside every other layer of the app (the guard's refusals and CORS's
preflights included), so no response goes out without them; a fault that
escapes a route is answered here too, with the body the route's contract
writes for a 500 (failure(scope)), and logged with its traceback.
"""
import json
import logging
import uuid

from .replies import ERROR_CODE_HEADER, RETRY_AFTER_S

REQUEST_ID_HEADER = "x-typesafe-request-id"
log = logging.getLogger("jevany.gateway")
BUSY = (429, 503)


class FieldHeaders:
    def __init__(self, app, failure=None):
        self.app = app
        self.failure = failure or (lambda scope: {"detail": "Internal Server Error"})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = f"req_{uuid.uuid4().hex}".encode()

        started = False

        async def sending(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers.append((REQUEST_ID_HEADER.encode(), request_id))
                if message["status"] in BUSY and b"retry-after" not in names:
                    headers.append((b"retry-after", RETRY_AFTER_S.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            return await self.app(scope, receive, sending)
        except Exception:
            if started:
                raise      # mid-response: the server closes the connection, which is all that is left to say
            log.exception("event=route_failed request_id=%s path=%s", request_id.decode(), scope.get("path"))
            body = json.dumps(self.failure(scope)).encode()
            await sending({"type": "http.response.start", "status": 500, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (ERROR_CODE_HEADER.lower().encode(), b"internal")]})
            await sending({"type": "http.response.body", "body": body})
