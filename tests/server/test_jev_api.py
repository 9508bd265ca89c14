"""TypeSafe's Jev API beside JevAny's: the names, fields, headers and bodies the field's clients read.

An embedded app (a model in this process, the gateway's routes) in each
dialect; the conformance suite and the official SDK against a real daemon
are in test_jev_clients.py.
"""
import gzip
import json

import pytest
from backports.zstd import compress

from jevany_daemon.asgi import JevModel, create_app
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.gateway.app import Gateway, create_app as routes
from jevany_daemon.gateway.dialects import score_confidence
from jevany_daemon.gateway.encodings import MAX_FRAMES

from .asgi_thread import serving
from .http_proc import Http

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Should we refund?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"Billing": None, "Shipping": "parcels"}},
    "anger": {"type": "score", "instructions": "How angry?", "criteria": ["Calm", None, "Furious"]},
}
BODY = {"model": "jev-latest", "state": "My parcel is two weeks late and nobody answers.", "questions": QUESTIONS}


@pytest.fixture(scope="module")
def model(loaded_model):
    return JevModel(Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8)))


@pytest.fixture(scope="module")
def apps(model):
    """(jevany port, typesafe port): one model, an app in each dialect."""
    with serving(create_app(model=model)) as jevany, serving(create_app(model=model, dialect="typesafe")) as strict:
        yield jevany, strict


def post(port, body, headers=None, raw=None):
    http = Http(port)
    try:
        return http.request("POST", "/v1/systemone", body, headers=headers, raw=raw)
    finally:
        http.close()


def test_the_field_s_names_for_the_current_model_are_this_deployment(apps):
    for name in ("jev-latest", "jev-preview", "jevany-latest"):
        status, _, reply = post(apps[0], {**BODY, "model": name})
        assert status == 200 and set(reply["answers"]) == set(QUESTIONS), (name, reply)
    status, headers, reply = post(apps[0], {**BODY, "model": "jev-2"})
    assert status == 422 and "unknown model 'jev-2'" in reply["detail"]
    status, _, reply = post(apps[1], {**BODY, "model": "jev-2"})     # TypeSafe's reference: 400, api_usage_error
    assert status == 400 and reply["detail"]["error_type"] == "api_usage_error"


def test_a_null_score_level_gets_a_rendered_legend_in_both_dialects(apps):
    for port in apps:
        status, _, reply = post(port, BODY)
        assert status == 200
        assert reply["answers"]["anger"]["legend"] == {"0": "Calm", "1": "", "2": "Furious"}
    numbered = {**BODY, "questions": {"anger": {"type": "score", "criteria": ["Calm", 2, True]}}}
    assert post(apps[0], numbered)[2]["answers"]["anger"]["legend"] == {"0": "Calm", "1": 2, "2": True}   # JevAny's
    assert post(apps[1], numbered)[2]["answers"]["anger"]["legend"] == {"0": "Calm", "1": "2", "2": "True"}


def test_extra_fields_and_confidence_follow_the_dialect(apps):
    status, _, jevany = post(apps[0], BODY)
    assert status == 200 and list(jevany) == ["model", "answers", "usage", "latency_ms"]
    status, _, strict = post(apps[1], BODY)
    assert status == 200 and list(strict) == ["model", "answers", "usage", "x_latency_ms"]
    # the same probabilities; only the score's confidence formula differs
    for qid in QUESTIONS:
        a, b = jevany["answers"][qid], strict["answers"][qid]
        assert a.get("probabilities") == b.get("probabilities") and a.get("noul") == b.get("noul")
    p = list(strict["answers"]["anger"]["probabilities"].values())
    assert strict["answers"]["anger"]["confidence"] == round(score_confidence(p), 2)
    mode = max(range(3), key=p.__getitem__)
    assert jevany["answers"]["anger"]["confidence"] == round(1 - sum(q * abs(i - mode) for i, q in enumerate(p)) / 2, 2)
    status, _, full = post(apps[1], BODY, headers={"X-Jevany-Daemon-Additions": "1"})
    assert status == 200 and all(key.startswith("x_") for key in full if key not in ("model", "answers", "usage"))
    assert "x_batch" in full and full["x_answers"]["refund"]["probabilities"]


def test_score_confidence_is_typesafe_s_reference():
    assert score_confidence([1.0, 0.0, 0.0]) == 1.0
    assert score_confidence([0.0, 1.0]) == 1.0
    # uniform over 3 levels: spread from the mode 0 is 1.0; the uniform's mean distance from the middle 2/3
    assert score_confidence([1 / 3, 1 / 3, 1 / 3]) == 0.0          # clipped at 0
    assert score_confidence([0.5, 0.5, 0.0]) == pytest.approx(1 - 0.5 / (2 / 3))


def test_error_bodies_follow_the_dialect(apps):
    bad = {**BODY, "questions": {"x": {"type": "choice", "criteria": "none"}}}
    status, headers, reply = post(apps[0], bad)
    assert status == 422 and isinstance(reply["detail"], list)          # FastAPI's, in both
    status, _, jevany = post(apps[0], {**BODY, "state": "x " * 9000})    # the daemon's own refusal
    status2, _, strict = post(apps[1], {**BODY, "state": "x " * 9000})
    assert (status, status2) == (422, 422)
    assert isinstance(jevany["detail"], str)
    assert strict["detail"][0]["msg"] == jevany["detail"] and strict["detail"][0]["loc"][0] == "body"
    http = Http(apps[1])
    status, _, reply = http.request("GET", "/v1/nothing")
    assert status == 404 and reply["detail"] == {"error_type": "not_found", "message": "Not Found"}
    status, headers, reply = http.request("GET", "/v1/systemone")
    assert status == 405 and reply["detail"]["error_type"] == "invalid_request_error" and "POST" in headers["allow"]
    http.close()
    http = Http(apps[0])
    assert http.request("GET", "/v1/nothing")[::2] == (404, {"detail": "Not Found"})      # JevAny's, as it was
    http.close()


def test_a_wrong_token_is_refused_in_the_field_s_shape_in_both_dialects(model):
    for dialect in ("jevany", "typesafe"):
        with serving(create_app(model=model, token="s3cret", dialect=dialect)) as port:
            status, headers, reply = post(port, BODY, headers={"Authorization": "Bearer nope"})
            assert status == 401 and reply["detail"]["error_type"] == "authentication_error"
            assert headers["x-typesafe-request-id"].startswith("req_")
            assert post(port, BODY, headers={"Authorization": "Bearer s3cret"})[0] == 200


def test_every_response_has_a_request_id_and_busy_ones_say_when_to_retry(apps):
    http = Http(apps[0])
    seen = set()
    for method, path, body in (("POST", "/v1/systemone", BODY), ("GET", "/v1/models", None), ("GET", "/health", None),
                               ("GET", "/nowhere", None), ("POST", "/v1/systemone", {"state": 1})):
        status, headers, _ = http.request(method, path, body)
        seen.add(headers["x-typesafe-request-id"])
    assert len(seen) == 5
    http.close()
    # a daemon whose model is still loading: 503 with Retry-After, the field's overloaded_error
    app = routes(Gateway(Loading(), {"max_message_bytes": 1 << 20, "http_dialect": "typesafe"}, None, None))
    with serving(app) as port:
        status, headers, reply = post(port, BODY)
        assert status == 503 and headers["retry-after"] == "1" and headers["x-typesafe-request-id"]
        assert reply["detail"]["error_type"] == "overloaded_error"


class Loading:
    """An upstream whose daemon is loading its model."""

    def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def call(self, op: str, body=None, timeout_ms=None, wait_s=30.0) -> dict:
        assert op == "status", f"a {op} reached a daemon that is not ready"
        return {"state": "starting"}


def test_models_entries_carry_what_the_sdk_and_jevany_s_tools_read(apps):
    http = Http(apps[0])
    status, _, reply = http.request("GET", "/v1/models")
    http.close()
    entry = reply["models"][0]
    assert status == 200 and entry["name"] == entry["id"] and entry["description"].startswith("a decision model")
    assert isinstance(entry["release_date"], str) and entry["readout"] == "native" and "limits" in entry
    from typesafe_sdk import TypeSafeClient

    with TypeSafeClient(api_key="none", base_url=f"http://127.0.0.1:{apps[1]}") as client:
        assert [m.name for m in client.models.list().models] == [entry["id"]]


def test_compressed_bodies_are_decoded_within_the_cap(apps):
    plain = json.dumps(BODY).encode()
    status, _, expected = post(apps[0], None, raw=plain, headers={"Content-Type": "application/json"})
    assert status == 200
    for encoding, packed in (("zstd", compress(plain)), ("gzip", gzip.compress(plain))):
        status, _, reply = post(apps[0], None, raw=packed,
                                headers={"Content-Type": "application/json", "Content-Encoding": encoding})
        assert status == 200 and reply["answers"] == expected["answers"], encoding


def test_a_zstd_bomb_is_refused_by_its_decoded_size(model):
    import resource
    import time

    limit = 64 << 10
    with serving(create_app(model=model, max_message_bytes=limit)) as port:
        bomb = compress(b" " * (1 << 30))          # 1 GiB of spaces in about 32 kB
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        status, headers, reply = post(port, None, raw=bomb, headers={"Content-Type": "application/json",
                                                                     "Content-Encoding": "zstd"})
        took = time.perf_counter() - started
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert status == 413 and "decodes (zstd) to more than 65,536 bytes" in reply["detail"]
        assert grew < 64 << 10, f"decoding grew the process by {grew} kB"        # ru_maxrss is in kB
        # One that does not declare its size in its header, streamed: decoded only to the cap.
        from backports.zstd import ZstdCompressor
        streamed = ZstdCompressor()
        unsized = streamed.compress(b" " * (8 << 20)) + streamed.flush()
        status, _, reply = post(port, None, raw=unsized, headers={"Content-Type": "application/json",
                                                                  "Content-Encoding": "zstd"})
        assert status == 413
        for raw, encoding, expect in ((b"\x28\xb5\x2f\xfd junk", "zstd", 400), (compress(b"{}")[:-2], "zstd", 400),
                                      (compress(b"") * (MAX_FRAMES + 1), "zstd", 400), (b"{}", "br", 415)):
            status, headers, reply = post(port, None, raw=raw, headers={"Content-Type": "application/json",
                                                                        "Content-Encoding": encoding})
            assert status == expect and headers["x-jevany-daemon-error"] == "invalid_request", (raw[:8], reply)
        assert took < 5


def test_images_as_assets_where_media_is_off_and_box_questions_get_a_typed_422(apps):
    # An embedded app serves text only: images sent the Jev API's way get JevAny's refusal of media
    # (test_media_requests.py serves them on a daemon with a media root).
    from typesafe_sdk._core.multipart import Part, encode_multipart

    body = {**BODY, "assets": {"photo": {"type": "image", "part": "asset-0"}}}
    kind, raw = encode_multipart([Part("request", "application/json", json.dumps(body).encode()),
                                  Part("asset-0", "image/png", b"\x89PNG\r\n\x1a\n", "asset-0")])
    for port in apps:
        for sent in ({"raw": raw, "headers": {"Content-Type": kind}}, {"body": body}):
            status, headers, reply = post(port, sent.get("body"), raw=sent.get("raw"), headers=sent.get("headers"))
            assert status == 422 and "media is disabled" in json.dumps(reply)
        box = {**BODY, "questions": {**QUESTIONS, "dog": {"type": "box", "instructions": "The dog"}}}
        status, headers, reply = post(port, box)
        assert status == 422 and "'dog' is a box question" in json.dumps(reply)
        bad = {"raw": b"--x\r\nContent-Disposition: form-data\r\n\r\n{}\r\n--x--\r\n",
               "headers": {"Content-Type": "multipart/form-data; boundary=x"}}
        status, _, reply = post(port, None, **bad)
        assert status == 422 and "needs a name" in json.dumps(reply)
    strict = post(apps[1], box)[2]
    assert strict["detail"][0]["loc"] == ["body", "questions", "dog", "type"]
    status, headers, reply = post_to(apps[0], "/v1/decisions", None, {"Content-Type": kind}, raw)
    assert status == 400 and headers["x-jevany-daemon-error"] == "unsupported_media"



DECISIONS = {
    "model": "jev-latest",
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "My parcel is two weeks late."},
                                            {"type": "input_text", "text": "Nobody answers."}]}],
    "questions": [
        {"type": "predicate", "name": "refund", "instructions": "Should we refund?"},
        {"type": "choice", "instructions": "Which team?",
         "choices": [{"value": "Billing"}, {"value": "Shipping", "description": "parcels"}]},
        {"type": "choice", "name": "refund", "instructions": "Escalate?", "choices": [{"value": True}, {"value": False}]},
        {"type": "score", "name": "anger", "instructions": "How angry?",
         "levels": [{"label": "Calm"}, {"label": "Cross", "description": "raised voice"}, {"label": "Furious"}]},
    ],
}
# What a Jev API caller sends for the same questions (docs/JEV-API.md, "OpenAI's Decisions API").
SAME_AS_SYSTEMONE = {
    "model": "jev-latest", "state": "My parcel is two weeks late.\n\nNobody answers.",
    "questions": {
        "0": {"type": "noul", "instructions": "Should we refund?"},
        "1": {"type": "choice", "instructions": "Which team?", "criteria": {"Billing": None, "Shipping": "parcels"}},
        "2": {"type": "choice", "instructions": "Escalate?", "criteria": {"true": None, "false": None}},
        "3": {"type": "score", "instructions": "How angry?", "criteria": ["Calm", "Cross: raised voice", "Furious"]},
    },
}


def test_decisions_answer_as_systemone_does_for_the_same_questions(apps):
    for port in apps:
        http = Http(port)
        status, _, decided = http.request("POST", "/v1/decisions", DECISIONS)
        status2, _, full = http.request("POST", "/v1/systemone", SAME_AS_SYSTEMONE,
                                        headers={"X-Jevany-Daemon-Additions": "1"})
        http.close()
        assert (status, status2) == (200, 200), decided
        raw = full.get("x_answers") or full["answers"]       # the protocol's answers, in either dialect
        assert list(decided) == ["model", "answers", "usage"] and decided["model"] == full["model"]
        refund, team, escalate, anger = decided["answers"]
        assert (refund["type"], refund["name"], team["name"], escalate["name"]) == ("predicate", "refund", None, "refund")
        assert abs(refund["probability"] - raw["0"]["probabilities"]["true"]) <= 1e-6
        assert [p["value"] for p in team["probabilities"]] == ["Billing", "Shipping"]
        for p in team["probabilities"]:
            assert abs(p["probability"] - raw["1"]["probabilities"][p["value"]]) <= 1e-6
        assert escalate["choice"] in (True, False) and [p["value"] for p in escalate["probabilities"]] == [True, False]
        assert [(p["value"], p["label"]) for p in anger["probabilities"]] == [(0, "Calm"), (1, "Cross"), (2, "Furious")]
        for p in anger["probabilities"]:
            assert abs(p["probability"] - raw["3"]["probabilities"][str(p["value"])]) <= 1e-6
        assert anger["score"] == pytest.approx(sum(p["value"] * p["probability"] for p in anger["probabilities"]))
        usage = decided["usage"]
        assert usage["input_tokens"] == full["usage"]["input_tokens"]
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_decisions_errors_carry_openai_s_envelope(apps, model):
    http = Http(apps[0])
    bad = {**DECISIONS, "questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "only"}]}]}
    status, headers, reply = http.request("POST", "/v1/decisions", bad)
    assert status == 400 and reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["param"].startswith("questions.0")
    numbered = {**DECISIONS, "questions": [{"type": "choice", "instructions": "x",
                                            "choices": [{"value": 1}, {"value": True}]}]}
    status, _, reply = http.request("POST", "/v1/decisions", numbered)     # 1 is not taken for true
    assert status == 400 and reply["error"]["param"] == "questions.0.choices.0.value"
    status, _, reply = http.request("POST", "/v1/decisions", {**DECISIONS, "model": "gpt-6-luna"})
    assert status == 404 and reply["error"]["code"] == "model_not_found"
    image = {**DECISIONS, "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}
    status, headers, reply = http.request("POST", "/v1/decisions", image)
    assert status == 400 and headers["x-jevany-daemon-error"] == "unsupported_media" and reply["error"]["param"] == "input"
    status, _, reply = http.request("POST", "/v1/decisions", {**DECISIONS, "input": "x " * 9000})
    assert status == 400 and "error" in reply                # the daemon's own refusal, in the same envelope
    http.close()
    with serving(create_app(model=model, token="s3cret")) as port:
        status, _, reply = post_to(port, "/v1/decisions", DECISIONS, {"Authorization": "Bearer nope"})
        assert status == 401 and reply["error"]["type"] == "authentication_error"


def post_to(port, path, body, headers=None, raw=None):
    http = Http(port)
    try:
        return http.request("POST", path, body, headers=headers, raw=raw)
    finally:
        http.close()


def test_compressed_bodies_count_in_the_gateway_budget_as_decoded():
    # Twelve small gzip bodies held at once fit a budget of eight bodies of the cap; the decoded
    # bytes are what is held. Bulk calls each hold two bodies' worth while they run.
    import asyncio

    from jevany_daemon.gateway.guard import BODY_BUDGET_MESSAGES, BULK_RESERVE_MESSAGES, RequestGuard

    async def scenario():
        release, inside = asyncio.Event(), []

        async def app(scope, receive, send):
            inside.append(scope["path"])
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        guard = RequestGuard(app, token=None, max_body_bytes=4096)
        packed = gzip.compress(json.dumps(BODY).encode())

        async def call(path, headers, body, client):
            sent, messages = [], iter([{"type": "http.request", "body": body, "more_body": False}])

            async def receive():
                return next(messages, {"type": "http.disconnect"})

            async def send(message):
                sent.append(message)

            # each call its own client, so no client's share of the budget is met: the budget is the test
            scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": headers,
                     "client": (client, 50000)}
            await guard(scope, receive, send)
            return sent[0]["status"]

        encoded = [(b"content-type", b"application/json"), (b"content-encoding", b"gzip"),
                   (b"content-length", str(len(packed)).encode())]
        calls = [asyncio.ensure_future(call("/v1/systemone", encoded, packed, f"10.0.0.{i}")) for i in range(12)]
        bulks = [asyncio.ensure_future(call("/v1/systemone/bulk", [], b"", f"10.0.1.{i}"))
                 for i in range(BODY_BUDGET_MESSAGES)]
        while len(inside) + sum(c.done() for c in calls + bulks) < len(calls) + len(bulks):
            await asyncio.sleep(0.01)     # until every call has been let in or refused (bounded below)
        refused = [c.result() for c in bulks if c.done()]
        release.set()
        return [await c for c in calls], [await c for c in bulks], refused

    plain, bulk, refused = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert plain == [200] * 12
    # what is left of the budget after the twelve decoded bodies, in bulk calls' reserves
    assert len(refused) == BODY_BUDGET_MESSAGES - (BODY_BUDGET_MESSAGES - 1) // BULK_RESERVE_MESSAGES
    assert set(refused) == {429} and bulk.count(200) == (BODY_BUDGET_MESSAGES - 1) // BULK_RESERVE_MESSAGES


def test_zstd_bodies_decode_on_the_standard_library_s_module_too(monkeypatch):
    # Python 3.14's compression.zstd is what backports.zstd backports: the same names, imported first.
    import sys
    import types

    import backports.zstd

    from jevany_daemon.gateway.encodings import decode

    package = types.ModuleType("compression")
    package.zstd = backports.zstd
    monkeypatch.setitem(sys.modules, "compression", package)
    monkeypatch.setitem(sys.modules, "compression.zstd", backports.zstd)
    assert decode(compress(b"{}" * 100), "zstd", 1000) == b"{}" * 100


def test_a_compressed_body_may_decode_to_exactly_the_cap_and_not_a_byte_more():
    from jevany_daemon.gateway.encodings import BodyEncodingError, decode

    limit = 4096
    for encoding, pack in (("zstd", compress), ("gzip", gzip.compress)):
        assert decode(pack(b"x" * limit), encoding, limit) == b"x" * limit
        assert decode(pack(b"x" * 96) + pack(b"y" * (limit - 96)), encoding, limit) == b"x" * 96 + b"y" * (limit - 96)
        with pytest.raises(BodyEncodingError) as refused:
            decode(pack(b"x" * (limit + 1)), encoding, limit)
        assert refused.value.status == 413, encoding


def test_gzip_is_accepted_by_its_other_name_and_any_case():
    # RFC 9110 8.4.1.3: x-gzip is gzip; older clients and proxies still send it.
    from jevany_daemon.gateway.encodings import decode

    for name in ("gzip", "x-gzip", "GZIP", " X-Gzip "):
        assert decode(gzip.compress(b'{"a": 1}'), name, 1000) == b'{"a": 1}', name


def test_no_number_that_is_not_finite_passes_at_any_depth():
    # JSON has no NaN or Infinity, but Python's parser takes them: they must not reach a prompt as text.
    from pydantic import TypeAdapter, ValidationError

    from jevany_daemon.gateway.shapes import Content

    content = TypeAdapter(Content)
    for bad in (float("nan"), [1, float("inf")], {"a": float("nan")}, {"a": {"b": [float("-inf")]}},
                [{"ok": 1, "bad": float("nan")}]):
        with pytest.raises(ValidationError, match="finite"):
            content.validate_python(bad)
    assert content.validate_python({"nan": [1.5, {"inf": "text"}]}) == {"nan": [1.5, {"inf": "text"}]}


def test_a_choice_of_one_option_is_a_question_the_field_accepts(apps):
    # TypeSafe's reference takes 1..4096 options; a caller's lone option must not become a 422 here.
    one = {**BODY, "questions": {"team": {"type": "choice", "criteria": {"Billing": None}}}}
    for port in apps:
        status, _, reply = post(port, one)
        assert status == 200, reply
        assert reply["answers"]["team"]["choice"] == "Billing"
    none = {**BODY, "questions": {"team": {"type": "choice", "criteria": {}}}}
    assert post(apps[0], none)[0] == 422


def test_the_api_description_names_every_route(apps):
    http = Http(apps[0])
    status, _, spec = http.request("GET", "/openapi.json")
    http.close()
    assert status == 200
    assert {"/v1/systemone", "/v1/decisions", "/v1/systemone/bulk", "/v1/models", "/health"} <= set(spec["paths"])
