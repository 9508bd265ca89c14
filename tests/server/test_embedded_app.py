"""JevAny's create_app(model=...) for JevModel: one model in this process, served to HTTP and Python callers at once."""
import http.client
import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi import FastAPI

from jevany_daemon import workloads
from jevany_daemon.asgi import JevModel, create_app
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine

from .asgi_thread import serving
from .http_proc import Http
from .jevany_replay import ANSWER_KEYS

BODIES = workloads.short(8, seed=23)


def close(a: dict, b: dict) -> bool:
    """Same JevAny answers, probabilities within the batched-equals-serial bound."""
    for qid, x in a["answers"].items():
        y = b["answers"][qid]
        if list(x) != ANSWER_KEYS[x["type"]] or list(y) != list(x) or x.get("choice") != y.get("choice"):
            return False
        if any(abs(p - y["probabilities"][k]) > 1e-5 for k, p in x.get("probabilities", {}).items()):
            return False
    return True


def test_http_and_python_callers_share_one_embedded_model(loaded_model):
    model = JevModel(Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8)))
    alone = [model(body) for body in BODIES]             # JevAny's model(request), one at a time
    with serving(create_app(model=model)) as port:
        def over_http(body):
            http = Http(port)
            try:
                return http.request("POST", "/v1/systemone", body)
            finally:
                http.close()

        with ThreadPoolExecutor(8) as pool:
            web = list(pool.map(over_http, BODIES))
            local = list(pool.map(model, BODIES))
        assert all(status == 200 for status, _, _ in web)
        assert all(close(a, b) for a, (_, _, b) in zip(alone, web)) and all(map(close, alone, local))
        assert all(list(reply) == ["model", "answers", "usage", "latency_ms"] for _, _, reply in web)
        http = Http(port)
        status, headers, reply = http.request("POST", "/v1/systemone", BODIES[0], headers={"X-JevAny-Timeout-Ms": "5"})
        assert (status, headers["x-jevany-daemon-error"]) == (422, "invalid_request") and "embedded" in reply["detail"]
        status, _, reply = http.request("POST", "/v1/systemone", {**BODIES[0], "media": [{"type": "image", "uri": "a"}]})
        assert status == 422 and reply["detail"].startswith("media is disabled: an embedded app serves text only")
        entry = http.request("GET", "/v1/models")[2]["models"][0]
        assert entry == model.models()[0] | {"prefix_cache": entry["prefix_cache"]}     # its counts moved meanwhile
        assert (entry["readout"], entry["prefix_cache"]["size"], entry["limits"]["media_enabled"]) == ("native", 4, False)
        http.close()
    assert close(alone[0], model(BODIES[0]))              # the model outlives its app, as in JevAny


def test_create_app_with_a_checkpoint_loads_it_while_starting(tiny_model):
    run = str(tiny_model("qwen3", "pointer"))
    with pytest.raises(ValueError, match="either a loaded model or checkpoint loading options"):
        create_app(run, model=object())
    with serving(create_app(run, model_name="factory", device="cpu")) as port:
        http = Http(port)
        status, _, reply = http.request("POST", "/v1/systemone", BODIES[0])
        assert (status, reply["model"]) == (200, "factory")
        http.close()


def test_from_pretrained_takes_jevany_arguments(tiny_model):
    plain = str(tiny_model("qwen3", "choice"))
    with pytest.raises(ValueError, match="readout native reads a JevAny checkpoint's own head"):
        JevModel.from_pretrained(plain, device="cpu")             # JevAny's default readout
    model = JevModel.from_pretrained(plain, device="cpu", readout="letter", letter_temperature=0.5)
    assert (model.describe()["readout"], model.describe()["choice_readout"]["temperature"]) == ("choice", 0.5)
    answer = model.system_one("a parcel is late", {"u": {"type": "noul"}})
    assert list(answer["answers"]["u"]) == ["type", "noul"]


def test_an_embedded_app_checks_the_token_and_the_bodys_size_before_reading_it(loaded_model):
    """The daemon's gateway guard (gateway/guard.py) in the embedded app too: a 300 MB body declared and never
    sent is refused from its headers, 401 without the token, 413 with it; a browser's preflight still passes."""
    from .test_hostile_clients import _http, _status_line

    model = JevModel(Engine(loaded_model("qwen3", "pointer"), EngineConfig(max_batch_size=8)))
    with serving(create_app(model=model, token="s3cret")) as port:
        huge = b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 300000000\r\n"
        reply = _http(port, huge + b"\r\n")
        assert _status_line(reply) == 401 and b"x-jevany-daemon-error: unauthorized" in reply.lower()
        reply = _http(port, huge + b"Authorization: Bearer s3cret\r\n\r\n")
        assert _status_line(reply) == 413 and b"--max-message-bytes" in reply
        reply = _http(port, b"OPTIONS /v1/systemone HTTP/1.1\r\nHost: x\r\nOrigin: https://page.example\r\n"
                            b"Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization\r\n\r\n")
        assert _status_line(reply) == 200 and b"access-control-allow-origin" in reply.lower()
        body = json.dumps(BODIES[0]).encode()
        reply = _http(port, b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Authorization: Bearer s3cret\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        assert _status_line(reply) == 200
    outer = FastAPI()                                   # mounted under a prefix, as behind a path-routing proxy
    outer.mount("/jevany", create_app(model=model, token="s3cret", max_message_bytes=1000))
    with serving(outer) as port:
        http = Http(port)
        assert http.request("GET", "/jevany/health")[0] == 200          # probes need no secret, prefixed or not
        assert http.request("GET", "/jevany/v1/models")[0] == 401
        status, _, reply = http.request("POST", "/jevany/v1/systemone", {**BODIES[0], "state": "x" * 2000},
                                        headers={"Authorization": "Bearer s3cret"})
        assert status == 413 and "1,000" in reply["detail"]          # its own limit, given to create_app
        http.close()


def test_a_body_without_content_type_is_read_as_json_and_another_type_is_named_in_the_refusal(loaded_model):
    model = JevModel(Engine(loaded_model()))
    body = json.dumps(BODIES[0]).encode()
    with serving(create_app(model=model)) as port:
        untyped = raw_post(port, body, [])
        assert untyped[0] == 200 and set(json.loads(untyped[1])["answers"]) == set(BODIES[0]["questions"])
        status, reply = raw_post(port, body, [("Content-Type", "text/plain")])
        assert status == 422 and json.loads(reply)["detail"] == (
            "the body must be JSON, sent with 'Content-Type: application/json' (or multipart/form-data with "
            "images), got Content-Type 'text/plain'")


def raw_post(port: int, body: bytes, headers: list) -> tuple[int, bytes]:
    """A POST as a bare HTTP library sends it: only the headers given, no Content-Type unless named."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("POST", "/v1/systemone")
        for name, value in [("Content-Length", str(len(body))), *headers]:
            connection.putheader(name, value)
        connection.endheaders(body)
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def test_choice_options_sent_as_a_list_get_the_shape_they_need_over_http(loaded_model):
    model = JevModel(Engine(loaded_model()))
    body = {"state": "parcel late", "questions": {"action": {"type": "choice", "criteria": ["refund", "resend"]}}}
    with serving(create_app(model=model)) as port:
        status, reply = raw_post(port, json.dumps(body).encode(), [("Content-Type", "application/json")])
    [problem] = json.loads(reply)["detail"]
    assert status == 422 and problem["loc"][-1] == "criteria"
    assert '{"refund": null, "resend": null}' in problem["msg"] and "map of option name" in problem["msg"]


def test_a_loaded_model_takes_no_loading_options_and_options_need_a_checkpoint(monkeypatch):
    monkeypatch.delenv("JEVANY_MODEL", raising=False)
    for refused in ({"model": object(), "checkpoint": "runs/x"}, {"model": object(), "revision": "main"},
                    {"model": object(), "dialect": "openai"}):
        with pytest.raises(ValueError):
            create_app(**refused)
    with pytest.raises(TypeError, match="checkpoint"):
        create_app(revision="main")


def _env_app(monkeypatch, tmp_path, **env):
    for name in [n for n in os.environ if n.startswith("JEVANY_")]:
        monkeypatch.delenv(name)
    (tmp_path / "model").mkdir(exist_ok=True)       # a directory: loaded only when the app starts
    for name, value in {"JEVANY_MODEL": str(tmp_path / "model"), **env}.items():
        monkeypatch.setenv(name, value)
    return create_app()


def test_the_settings_app_refuses_media_and_reads_its_token_file_as_a_line(monkeypatch, tmp_path):
    import asyncio

    import httpx

    with pytest.raises(SystemExit, match="MEDIA_ROOT"):
        _env_app(monkeypatch, tmp_path, JEVANY_MEDIA_ROOT=str(tmp_path))
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    app = _env_app(monkeypatch, tmp_path, JEVANY_HTTP_TOKEN_FILE=str(token), JEVANY_HTTP="127.0.0.1:8008")

    async def statuses():
        # No lifespan here: the model is never loaded, so an authorised call is 503, a refused one 401.
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            return [(await client.get("/v1/models", headers={"Authorization": auth})).status_code
                    for auth in ("Bearer s3cret", "Bearer nope")]
    assert asyncio.run(statuses()) == [503, 401]
