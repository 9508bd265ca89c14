"""The headers the Jev API's clients read on every response: a request id, and when to retry a busy server.

typesafe-sdk puts `x-typesafe-request-id` into every error it raises, so a
report names the request the server saw; it retries 408, 429 and 5xx after
`retry-after` (or `retry-after-ms`) when given, else after its own backoff.
Added outside every other layer of the app (the guard's refusals and CORS's
preflights included), so no response goes out without them.
"""
import uuid

from .replies import RETRY_AFTER_S

REQUEST_ID_HEADER = "x-typesafe-request-id"
BUSY = (429, 503)


class FieldHeaders:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = f"req_{uuid.uuid4().hex}".encode()

        async def sending(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers.append((REQUEST_ID_HEADER.encode(), request_id))
                if message["status"] in BUSY and b"retry-after" not in names:
                    headers.append((b"retry-after", RETRY_AFTER_S.encode()))
                message = {**message, "headers": headers}
            await send(message)

        return await self.app(scope, receive, sending)
