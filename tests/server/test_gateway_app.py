"""The gateway's routes (gateway/app.py) on a fake upstream, in process: no daemon, no model, no socket."""
import asyncio
import json

import httpx

from jevany_client.errors import OverloadedError
from jevany_daemon.gateway.app import DECIDE_WAIT_S, Gateway, create_app
from jevany_daemon.gateway.paths import SYSTEMONE_PATH

BODY = {"state": "s", "questions": {"q": {"type": "noul"}}}
RESULT = {"model": "jev-latest", "answers": {}, "usage": {}, "latency_ms": 1, "batch": {"size": 1}}


class Scripted:
    """Upstream's call, answered from a script: each op's reply (a dict, or an error to raise); every call kept."""

    def __init__(self, **replies):
        self.replies, self.calls = replies, []

    async def call(self, op, body=None, timeout_ms=None, wait_s=30.0):
        self.calls.append((op, timeout_ms, wait_s))
        reply = self.replies[op]
        if isinstance(reply, Exception):
            raise reply
        return reply


def _gateway(upstream, **settings) -> Gateway:
    return Gateway(upstream, {"max_message_bytes": 1 << 20, **settings}, None, None)


def _call(gateway, requests):
    """Each (method, path, headers, body) in turn; their (status, headers, JSON body)."""
    async def go():
        transport = httpx.ASGITransport(app=create_app(gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            replies = [await client.request(method, path, headers=headers, json=body)
                       for method, path, headers, body in requests]
            return [(r.status_code, r.headers, r.json()) for r in replies]
    return asyncio.run(go())


def _health(daemon) -> tuple[int, str]:
    [(status, _, body)] = _call(_gateway(Scripted(status=daemon)), [("GET", "/health", {}, None)])
    return status, body["status"]


def test_health_says_ready_only_when_requests_are_served():
    assert _health({"state": "ready"}) == (200, "ready")           # a status without `serving` serves
    assert _health({"state": "ready", "serving": True}) == (200, "ready")
    assert _health({"state": "ready", "serving": False}) == (503, "loading")
    assert _health({"state": "starting"}) == (503, "loading")
    assert _health({"state": "draining"}) == (503, "draining")
    assert _health({"state": "drained"}) == (503, "draining")
    assert _health(OverloadedError("no")) == (503, "unavailable")


def test_a_daemon_that_is_draining_or_drained_has_loaded():
    for state, ready in (("ready", True), ("draining", True), ("drained", True), ("starting", False)):
        gateway = _gateway(Scripted(status={"state": state}))
        assert asyncio.run(gateway.is_ready()) is ready, state


def test_the_timeout_header_is_milliseconds_in_the_queue_and_the_wait_outlasts_it():
    upstream = Scripted(status={"state": "ready"}, decide=RESULT)
    replies = _call(_gateway(upstream), [("POST", SYSTEMONE_PATH, {}, BODY),
                                         ("POST", SYSTEMONE_PATH, {"X-JevAny-Timeout-Ms": "2500"}, BODY),
                                         ("POST", SYSTEMONE_PATH, {"X-JevAny-Timeout-Ms": "2.5s"}, BODY)])
    assert [status for status, _, _ in replies] == [200, 200, 422]
    decides = [call for call in upstream.calls if call[0] == "decide"]
    assert decides == [("decide", None, DECIDE_WAIT_S), ("decide", 2500, 2.5 + DECIDE_WAIT_S)]


def test_an_unknown_route_is_not_found_and_a_wrong_method_is_a_bad_request():
    gateway = _gateway(Scripted(status={"state": "ready"}))
    (missing, m_headers, _), (wrong, w_headers, _) = _call(gateway, [("GET", "/v1/nothing", {}, None),
                                                                     ("GET", SYSTEMONE_PATH, {}, None)])
    assert (missing, m_headers["x-jevany-daemon-error"]) == (404, "not_found")
    assert (wrong, w_headers["x-jevany-daemon-error"]) == (405, "invalid_request")


def test_a_model_that_has_not_loaded_is_503_with_a_retry():
    gateway = _gateway(Scripted(status={"state": "starting"}, decide=RESULT))
    [(status, headers, _)] = _call(gateway, [("POST", SYSTEMONE_PATH, {}, BODY)])
    assert (status, headers["x-jevany-daemon-error"], headers["retry-after"]) == (503, "not_ready", "1")


def test_metrics_off_is_not_found():
    [(status, headers, _)] = _call(_gateway(Scripted()), [("GET", "/metrics", {}, None)])
    assert (status, headers["x-jevany-daemon-error"]) == (404, "not_found")


def test_a_browser_page_may_read_the_request_id_of_a_cross_origin_answer():
    [(status, headers, _)] = _call(_gateway(Scripted(status={"state": "ready"})),
                                   [("GET", "/health", {"origin": "http://page.example"}, None)])
    exposed = {h.strip().lower() for h in headers["access-control-expose-headers"].split(",")}
    assert status == 200 and "x-typesafe-request-id" in exposed


def test_an_uploaded_image_is_removed_once_its_request_is_answered(tmp_path):
    gateway = Gateway(Scripted(status={"state": "ready"}, decide=RESULT), {"max_message_bytes": 1 << 20}, None, None,
                      uploads=str(tmp_path))
    request = {**BODY, "assets": {"a": {"type": "image", "part": "p"}}}
    body = (b"--B\r\nContent-Disposition: form-data; name=\"request\"\r\nContent-Type: application/json\r\n\r\n"
            + json.dumps(request).encode() + b"\r\n--B\r\nContent-Disposition: form-data; name=\"p\"\r\n"
            b"Content-Type: image/png\r\n\r\n\x89PNGxx\r\n--B--\r\n")

    async def go():
        transport = httpx.ASGITransport(app=create_app(gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.post(SYSTEMONE_PATH, content=body,
                                     headers={"content-type": "multipart/form-data; boundary=B"})
    reply = asyncio.run(go())
    assert reply.status_code == 200, reply.text
    assert "decide" in [op for op, _, _ in gateway.upstream.calls] and list(tmp_path.iterdir()) == []
