"""The headers on every response, and a route's fault answered in its contract's shape (gateway/field_headers.py)."""
import asyncio
import json

import pytest

from jevany_daemon.gateway.field_headers import REQUEST_ID_HEADER, FieldHeaders


def _run(app):
    """The messages FieldHeaders sends for one GET, and what it raised (None: nothing)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    async def go():
        scope = {"type": "http", "method": "GET", "path": "/v1/x", "headers": []}
        try:
            await FieldHeaders(app, failure=lambda scope: {"error": scope["path"]})(scope, receive, send)
        except RuntimeError as exc:
            return exc
        return None
    raised = asyncio.run(go())
    return sent, raised


def test_a_fault_before_the_answer_is_a_500_in_the_route_s_shape_with_a_request_id():
    async def failing(scope, receive, send):
        raise RuntimeError("a bug")
    (start, body), raised = _run(failing)
    headers = dict(start["headers"])
    assert raised is None and start["status"] == 500
    assert headers[b"x-jevany-daemon-error"] == b"internal"
    assert headers[REQUEST_ID_HEADER.encode()].startswith(b"req_")
    assert json.loads(body["body"]) == {"error": "/v1/x"} and headers[b"content-length"] == str(len(body["body"])).encode()


def test_a_fault_mid_answer_is_left_to_the_server_to_close_the_connection():
    async def failing(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("a bug")
    sent, raised = _run(failing)
    assert isinstance(raised, RuntimeError) and [m["type"] for m in sent] == ["http.response.start"]


@pytest.mark.parametrize("status, retry", [(429, [b"1"]), (503, [b"1"]), (500, []), (504, [])])
def test_only_busy_answers_get_a_retry_after(status, retry):
    async def answering(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    (start, _), _ = _run(answering)
    assert [v for k, v in start["headers"] if k == b"retry-after"] == retry
