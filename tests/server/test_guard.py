"""The HTTP gateway's guard and CORS, in process: no daemon, no model, no socket (httpx's ASGI transport)."""
import asyncio
import json

import httpx

from jevany_daemon.asgi import create_app
from jevany_daemon.gateway.guard import BODY_BUDGET_MESSAGES, BULK_RESERVE_MESSAGES, CLIENT_SHARE_MESSAGES, RequestGuard
from jevany_daemon.gateway.paths import BULK_PATH, SYSTEMONE_PATH

TOKEN = "s3cret"


async def _echo(scope, receive, send):
    """An app behind the guard: reads the body it is given and answers 200 with its length."""
    size = 0
    while scope["type"] == "http":
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps({"size": size}).encode()})


def _call(app, requests):
    """Each (method, path, headers, body) sent to app in turn; their (status, headers)."""
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            return [(r.status_code, r.headers) for r in
                    [await client.request(method, path, headers=headers, content=body)
                     for method, path, headers, body in requests]]
    return asyncio.run(go())


def test_the_bearer_scheme_is_matched_whatever_its_case_the_token_exactly():
    # RFC 7235 2.1 and RFC 6750: an auth scheme is case-insensitive; the token itself is not.
    guard = RequestGuard(_echo, token=TOKEN, max_body_bytes=1000)
    body = b'{"a": 1}'
    statuses = [status for status, _ in _call(guard, [
        ("POST", SYSTEMONE_PATH, {"Authorization": auth, "Content-Type": "application/json"}, body)
        for auth in ("Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR s3cret",
                     "Bearer S3CRET", "Basic s3cret", "s3cret", "Bearer", "Bearer s3cret2")])]
    assert statuses == [200, 200, 200, 200, 401, 401, 401, 401, 401]


def test_every_request_gives_back_what_its_body_held():
    # Each body takes most of a --max-message-bytes; with one forgotten, one client's share (and then the
    # budget) would be spent after a few requests and every later body refused 429 for good.
    guard = RequestGuard(_echo, token=TOKEN, max_body_bytes=1000)
    auth = {"Authorization": "Bearer s3cret"}
    json_type = {**auth, "Content-Type": "application/json"}
    body = b'{"pad": "' + b"x" * 900 + b'"}'
    rounds = 3 * BODY_BUDGET_MESSAGES * CLIENT_SHARE_MESSAGES
    requests = [("POST", SYSTEMONE_PATH, json_type, body)] * rounds
    requests += [("POST", SYSTEMONE_PATH, {**auth, "Content-Type": "text/plain"}, body)] * rounds   # 422, read first
    requests += [("POST", SYSTEMONE_PATH, auth, body)] * rounds                                   # no type: read as JSON
    requests += [("POST", BULK_PATH, json_type, body)] * rounds                                   # reserved while it runs
    requests += [("POST", SYSTEMONE_PATH, json_type, body)]
    replies = [status for status, _ in _call(guard, requests)]
    assert replies == [200] * rounds + [422] * rounds + [200] * (2 * rounds) + [200]
    assert (guard.holding, guard.by_client) == (0, {})


def _preflight(origin: str):
    return ("OPTIONS", SYSTEMONE_PATH, {"Origin": origin, "Access-Control-Request-Method": "POST",
                                        "Access-Control-Request-Headers": "authorization,content-type"}, b"")


def test_cors_origins_narrowed_answer_only_the_origins_listed():
    app = create_app(model=object(), token=TOKEN, cors_origins="https://app.example, https://b.example:8443")
    listed, other = "https://app.example", "https://evil.example"
    replies = _call(app, [_preflight(listed), _preflight("https://b.example:8443"), _preflight(other),
                          ("POST", SYSTEMONE_PATH, {"Origin": listed}, b"{}"),
                          ("POST", SYSTEMONE_PATH, {"Origin": other}, b"{}")])
    allowed = [headers.get("access-control-allow-origin") for _, headers in replies]
    assert allowed == [listed, "https://b.example:8443", None, listed, None]
    assert [status for status, _ in replies[3:]] == [401, 401]      # the guard's refusal, inside CORS
    # '' is none at all; the default, '*', every origin (JevAny's).
    none = _call(create_app(model=object(), cors_origins=""), [_preflight(listed), _preflight(other)])
    assert [headers.get("access-control-allow-origin") for _, headers in none] == [None, None]
    every = _call(create_app(model=object()), [_preflight(other)])
    assert every[0][1].get("access-control-allow-origin") in ("*", other)


def _redirecting(location: bytes):
    """An app behind the guard that redirects to location, as Starlette's slash redirect would."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 307, "headers": [(b"location", location)]})
        await send({"type": "http.response.body", "body": b""})
    return app


def test_a_redirect_keeps_its_path_and_never_names_a_host():
    # Starlette writes Location from the Host header a client sent; a browser reads "//h" and "/\h" as
    # the host h, so what is left must start with one slash and no second slash or backslash.
    sent = {b"http://evil.example/v1/systemone": "/v1/systemone",
            b"https://evil.example:8443/v1/systemone?x=1": "/v1/systemone?x=1",
            b"http://gw//evil.example/x": "/evil.example/x",
            b"http://gw/\\evil.example/x": "/evil.example/x",
            b"/\\\\evil.example/x": "/evil.example/x",
            b"\\/evil.example/x": "/evil.example/x",
            b"/health/": "/health/"}
    got = {}
    for location, expected in sent.items():
        guard = RequestGuard(_redirecting(location), token=None, max_body_bytes=1000)
        [(status, headers)] = _call(guard, [("GET", "/health", {}, b"")])
        got[location] = (status, headers["location"])
    assert got == {location: (307, expected) for location, expected in sent.items()}


def test_json_with_a_structured_suffix_is_json_and_other_types_are_refused():
    # RFC 6839: application/<anything>+json is JSON; a body of another declared type is refused 422.
    guard = RequestGuard(_echo, token=None, max_body_bytes=1000)
    types = ("application/json", "application/json; charset=utf-8", "Application/JSON",
             "application/vnd.jev.v1+json", "application/merge-patch+json", "text/plain", "application/jsonx",
             "application/x-www-form-urlencoded")
    statuses = [status for status, _ in _call(guard, [
        ("POST", SYSTEMONE_PATH, {"Content-Type": kind}, b'{"a": 1}') for kind in types])]
    assert statuses == [200, 200, 200, 200, 200, 422, 422, 422]


def test_retry_after_marks_the_errors_worth_retrying_and_no_others():
    # A client's backoff reads Retry-After: on a refusal it should not repeat, it would retry for nothing.
    from jevany_daemon.gateway.replies import RETRY_AFTER, RETRY_AFTER_S, error_response
    for code in sorted(RETRY_AFTER):
        assert error_response(code, "busy").headers.get("retry-after") == RETRY_AFTER_S, code
    for code in ("invalid_request", "unauthorized", "context_length_exceeded", "deadline_exceeded", "internal"):
        assert "retry-after" not in error_response(code, "no").headers, code


def _answering(status: int, headers: list):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})
    return app


def test_every_busy_answer_says_when_to_retry_and_keeps_a_retry_after_of_its_own():
    # typesafe-sdk waits what Retry-After says on 429 and 503, else backs off on its own schedule.
    from jevany_daemon.gateway.field_headers import REQUEST_ID_HEADER, FieldHeaders
    from jevany_daemon.gateway.replies import RETRY_AFTER_S
    seen = []
    for status, own in ((503, []), (429, []), (503, [(b"retry-after", b"7")]), (200, []), (400, [])):
        [(got, headers)] = _call(FieldHeaders(_answering(status, own)), [("GET", "/health", {}, b"")])
        seen.append((got, headers.get_list("retry-after"), bool(headers.get(REQUEST_ID_HEADER))))
    assert seen == [(503, [RETRY_AFTER_S], True), (429, [RETRY_AFTER_S], True), (503, ["7"], True),
                    (200, [], True), (400, [], True)]


def test_a_bulk_call_holds_what_it_may_read_ahead_while_it_runs_and_gives_it_back():
    # A bulk body is read as it arrives, never held whole: the budget is spent up front on what the route may
    # hold at once (the body read ahead, the line it reads, the lines in flight), so many bulk calls cannot
    # together hold more than the budget says.
    holding = []

    async def app(scope, receive, send):
        holding.append(guard.holding)
        await _echo(scope, receive, send)

    guard = RequestGuard(app, token=None, max_body_bytes=1000)
    [(status, _)] = _call(guard, [("POST", BULK_PATH, {"Content-Type": "application/json"}, b'{"a": 1}')])
    assert (status, holding, guard.holding) == (200, [BULK_RESERVE_MESSAGES * 1000], 0)


def _direct(guard, chunks, headers=(), method="POST", path=SYSTEMONE_PATH, root_path=""):
    """One request straight to the guard, its body in `chunks` (one ASGI message each, no Content-Length
    unless given): (status, the scope and body the app behind it saw, or None)."""
    seen, sent = [], []
    messages = iter([*({"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                       for i, c in enumerate(chunks)), {"type": "http.disconnect"}])

    async def receive():
        return next(messages)

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append((scope, body, guard.holding))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard.app = app
    scope = {"type": "http", "method": method, "path": root_path + path, "root_path": root_path,
             "headers": list(headers), "client": ("10.0.0.1", 5000)}
    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"], (seen[0] if seen else None)


def test_a_streamed_body_of_exactly_the_limit_passes_and_one_byte_more_does_not():
    guard = RequestGuard(_echo, token=None, max_body_bytes=1000)
    body = b'{"p": "' + b"x" * 991 + b'"}'
    assert len(body) == 1000
    assert _direct(guard, [body[:500], body[500:]])[0] == 200
    assert _direct(guard, [body[:500], body[500:] + b" "])[0] == 413
    assert (guard.holding, guard.by_client) == (0, {})


def test_a_declared_length_of_exactly_the_limit_passes_and_one_byte_more_is_refused_unread():
    # --max-message-bytes is the largest body allowed, so a Content-Length equal to it is read; one past it
    # is answered 413 from the header alone (the app never sees that request).
    guard = RequestGuard(_echo, token=None, max_body_bytes=1000)
    body = b'{"p": "' + b"x" * 991 + b'"}'
    json_type = (b"content-type", b"application/json")
    status, (_, seen, _) = _direct(guard, [body], [json_type, (b"content-length", b"1000")])
    assert (status, seen) == (200, body)
    assert _direct(guard, [body + b" "], [json_type, (b"content-length", b"1001")]) == (413, None)
    assert (guard.holding, guard.by_client) == (0, {})


def test_a_compressed_body_is_held_as_decoded_and_reaches_the_route_plain():
    import gzip
    guard = RequestGuard(_echo, token=None, max_body_bytes=1000)
    plain = b'{"p": "' + b"x" * 800 + b'"}'
    packed = gzip.compress(plain)
    status, (scope, body, holding) = _direct(guard, [packed], [(b"content-type", b"application/json"),
                                                               (b"content-encoding", b"gzip"),
                                                               (b"content-length", str(len(packed)).encode())])
    assert (status, body, holding) == (200, plain, len(plain))
    assert [v for k, v in scope["headers"] if k in (b"content-encoding", b"content-length")] == [
        str(len(plain)).encode()]


def test_a_body_sent_with_another_method_is_checked_as_a_post_s():
    guard = RequestGuard(_echo, token=None, max_body_bytes=1000)
    text = [(b"content-type", b"text/plain"), (b"content-length", b"8")]
    assert _direct(guard, [b'{"a": 1}'], text, method="GET")[0] == 422
    assert _direct(guard, [b""], [(b"content-type", b"text/plain")], method="GET")[0] == 200   # no body at all


def test_a_budget_already_spent_refuses_the_next_body_even_an_empty_one():
    guard = RequestGuard(_echo, token=None, max_body_bytes=1000)
    guard.holding = guard.budget
    assert _direct(guard, [b""], [(b"content-type", b"application/json")])[0] == 429
    guard.holding, guard.by_client = 0, {"10.0.0.1": guard.share}
    assert _direct(guard, [b""], [(b"content-type", b"application/json")])[0] == 429


def test_one_client_past_its_share_is_refused_though_the_budget_has_room_and_another_client_is_not():
    # Other requests of 10.0.0.1 hold all but 500 bytes of its share; the budget, twice the share, has room.
    guard = RequestGuard(_echo, token=None, max_body_bytes=1000)
    json_type = [(b"content-type", b"application/json")]
    up_to, past = (b'{"p": "' + b"x" * (size - 9) + b'"}' for size in (500, 501))
    held = guard.share - 500
    assert held + len(past) < guard.budget
    guard.holding, guard.by_client = held, {"10.0.0.1": held}
    assert _direct(guard, [up_to], json_type)[0] == 200             # exactly up to its share
    assert _direct(guard, [past], json_type)[0] == 429
    assert (guard.holding, guard.by_client) == (held, {"10.0.0.1": held})
    # Held by another address instead, the same body is read: the share is each client's own.
    guard.by_client = {"10.0.0.2": held}
    assert _direct(guard, [past], json_type)[0] == 200
    assert (guard.holding, guard.by_client) == (held, {"10.0.0.2": held})


def test_public_paths_are_matched_under_the_root_path_an_app_is_mounted_at():
    guard = RequestGuard(_echo, token=TOKEN, max_body_bytes=1000)
    assert _direct(guard, [b""], method="GET", path="/health", root_path="/api")[0] == 200
    assert _direct(guard, [b""], method="GET", path="/v1/models", root_path="/api")[0] == 401
    assert _direct(guard, [b""], method="GET", path="/healthz", root_path="/api")[0] == 401


def test_the_daemon_s_caps_are_counted_exactly_at_their_limits_and_strings_hold_what_they_like():
    from jevany_client.protocol import MAX_CONTAINERS, MAX_VALUES

    from jevany_daemon.gateway.guard import count_problem
    assert count_problem(b"[" * MAX_CONTAINERS) is None
    assert count_problem(b"[" * (MAX_CONTAINERS + 1)) is not None
    assert count_problem(b"," * (MAX_VALUES - 1) + b"[") is None
    assert count_problem(b"," * MAX_VALUES + b"[") is not None
    assert count_problem(b'["' + b"{[," * MAX_CONTAINERS + b'"]') is None
    # a bracket in a string makes the first count pass the cap; the exact count is then at it, not past it
    assert count_problem(b'"{"' + b"[" * MAX_CONTAINERS) is None
