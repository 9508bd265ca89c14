"""JevAny's HTTP API through the gateway process: real daemons, a real HTTP client, loopback only."""
import multiprocessing as mp
import os
import signal
import time

import pytest

from jevany_client import JevClient, JevTimeoutError
from jevany_client.answers import jevany_answers
from jevany_daemon import workloads
from jevany_daemon.parity import compare

from .client_proc import stream
from .daemons import wait_for
from .http_proc import Http, decide_stream, free_port, until_stopped
from .shared_daemons import Raw

BODY = {
    "state": {"ticket": "parcel two weeks late", "tier": "gold"},
    "questions": {
        "action": {"type": "choice", "instructions": "Next step?",
                   "criteria": {"refund": None, "resend": "ship it again", "escalate": None}},
        "urgent": {"type": "noul", "instructions": "Is this urgent?", "criteria": {"true": "act today"}},
        "severity": {"type": "score", "criteria": ["low", "medium", "high"]},
    },
}


def http_daemon(start_daemon, *args, ready=True, **kw):
    port = free_port()
    daemon = start_daemon("--http", f"127.0.0.1:{port}", *args, ready=ready, **kw)
    if ready:
        wait_for(lambda: _health(port) == 200, 60, "the gateway answering /health")
    return daemon, port


def _health(port: int):
    try:
        client = Http(port, timeout=5)
        try:
            return client.request("GET", "/health")[0]
        finally:
            client.close()
    except OSError:
        return None


def test_every_route_answers_as_jevany_does(start_daemon):
    daemon, port = http_daemon(start_daemon, "--metrics-port", "0", readout="choice")
    http = Http(port)
    status, headers, answer = http.request("POST", "/v1/systemone", BODY)
    assert status == 200, answer
    with daemon.client() as client:
        expected = client.decide(BODY["state"], BODY["questions"])
    # JevAny's body, its answer shapes key for key, the same as over ZeroMQ less our additions
    assert list(answer) == ["model", "answers", "usage", "latency_ms"]
    want_answers = jevany_answers(expected["answers"])
    for qid, got in answer["answers"].items():
        want = want_answers[qid]
        assert list(got) == list(want) and got["type"] == BODY["questions"][qid]["type"]
        for field in got:
            if field == "probabilities":
                assert got[field].keys() == want[field].keys()
                assert all(abs(got[field][k] - want[field][k]) <= 1e-6 for k in got[field])
            else:
                assert got[field] == want[field], (qid, field)
    assert answer["answers"]["severity"]["legend"] == {"0": "low", "1": "medium", "2": "high"}
    assert answer["usage"] == expected["usage"] and answer["model"] == expected["model"]
    # the pass's batch in headers; the protocol's result whole on request
    assert int(headers["x-jevany-daemon-batch-size"]) >= 1 and int(headers["x-jevany-daemon-padded-tokens"]) > 0
    status, _, full = http.request("POST", "/v1/systemone", BODY, headers={"X-Jevany-Daemon-Additions": "1"})
    assert status == 200 and set(full) == set(expected) and set(full["answers"]["urgent"]["probabilities"]) == \
        {"false", "true"}

    # unknown fields are ignored over HTTP, at the top and inside a question (ZeroMQ v1 stays strict)
    extra = {**BODY, "trace_id": "abc", "questions": {
        "urgent": {**BODY["questions"]["urgent"], "weight": 3}}}
    status, _, answer = http.request("POST", "/v1/systemone", extra)
    assert status == 200 and set(answer["answers"]) == {"urgent"}

    status, _, models = http.request("GET", "/v1/models")
    assert status == 200 and len(models["models"]) == 1
    limits = models["models"][0]["limits"]
    assert limits["media_enabled"] is False
    assert (limits["media_max_file_bytes"], limits["media_max_total_bytes"]) == (50 << 20, 100 << 20)
    assert (limits["media_max_pixels"], limits["media_max_video_frames"]) == (4096 * 4096, 3600)

    assert http.request("GET", "/health")[::2] == (200, {"status": "ready"})
    status, _, spec = http.request("GET", "/openapi.json")
    assert status == 200 and {"/v1/systemone", "/v1/models", "/health"} <= set(spec["paths"])
    assert http.request("GET", "/docs")[0] == 404       # off: its page would load scripts from a CDN

    status, headers, text = http.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert 'jevany_requests_total{op="decide",outcome="ok",transport="http"} 3.0' in text
    assert 'jevany_requests_total{op="decide",outcome="ok",transport="zmq"} 1.0' in text
    counted = daemon.status()["requests"]["decide_by_transport"]
    assert counted == {"zmq": 1, "http": 3}
    http.close()
    assert daemon.stop() == 0


def test_every_error_status_with_its_code(start_daemon):
    daemon, port = http_daemon(start_daemon, "--max-queue", "2", "--max-message-bytes", "65536",
                               "--heartbeat-timeout", "60", readout="choice")
    http = Http(port)

    def post(body, headers=None, raw=None):
        return http.request("POST", "/v1/systemone", body, headers=headers, raw=raw)

    # pydantic's validation: JevAny's 422 detail list, with where it failed
    status, headers, reply = post({"state": "s", "questions": {}})
    assert status == 422 and reply["detail"][0]["loc"] == ["body", "questions"]
    assert headers["x-jevany-daemon-error"] == "invalid_request" and "x-jevany-error-code" not in headers
    status, _, reply = post(None, raw=b'{"state": NaN, "questions": {"q": {"type": "noul"}}}')
    assert status == 422 and reply["detail"][0]["loc"][:2] == ["body", "state"]
    assert reply["detail"][0]["input"] == "nan"              # a non-finite echo is never sent as a number
    status, _, reply = post({"state": "s", "questions": {"q": {"type": "noul", "criteria": {"maybe": 1}}}})
    assert status == 422 and "unknown keys: ['maybe']" in reply["detail"][0]["msg"]
    # the daemon's own rules: 422 with a string detail and our code
    status, headers, reply = post({**BODY, "model": "other"})
    assert (status, headers["x-jevany-daemon-error"]) == (422, "unknown_model")
    assert reply["detail"].startswith("unknown model 'other'") and "x-jevany-error-code" not in headers
    status, headers, reply = post({"state": "word " * 6000, "questions": {"q": {"type": "noul"}}})
    assert (status, headers["x-jevany-daemon-error"]) == (422, "context_length_exceeded")
    assert headers["x-jevany-error-code"] == "context_length_exceeded"          # JevAny's, on this code alone
    status, headers, reply = post({"state": 2 ** 70, "questions": {"q": {"type": "noul"}}})
    assert (status, headers["x-jevany-daemon-error"]) == (422, "invalid_request")    # msgpack has no such int
    status, headers, reply = post(BODY, headers={"X-JevAny-Timeout-Ms": "soon"})
    assert (status, headers["x-jevany-daemon-error"]) == (422, "invalid_request") and "milliseconds" in reply["detail"]
    status, headers, reply = post({"state": "x" * 70000, "questions": {"q": {"type": "noul"}}})
    assert (status, headers["x-jevany-daemon-error"]) == (413, "invalid_request")
    assert "--max-message-bytes" in reply["detail"]

    # A stopped worker holds one request; the queue then fills: 504, 429, and a killed worker's 503
    worker = daemon.workers()[0]["pid"]
    os.kill(worker, signal.SIGSTOP)
    pending = [Http(port) for _ in range(3)]
    try:
        pending[0].conn.request("POST", "/v1/systemone", body=_json(BODY), headers=_JSON)
        wait_for(lambda: daemon.workers()[0]["inflight"] == 1, 30, "the request handed to the stopped worker")
        status, headers, reply = post(BODY, headers={"X-JevAny-Timeout-Ms": "100"})
        assert (status, headers["x-jevany-daemon-error"]) == (504, "deadline_exceeded")
        for conn in pending[1:]:
            conn.conn.request("POST", "/v1/systemone", body=_json(BODY), headers=_JSON)
        wait_for(lambda: daemon.status()["queue"]["depth"] == 2, 30, "two requests queued")
        status, headers, reply = post(BODY)
        assert (status, headers["x-jevany-daemon-error"], headers["retry-after"]) == (429, "overloaded", "1")
        assert "x-jevany-error-code" not in headers
        os.kill(worker, signal.SIGKILL)
        status = pending[0].conn.getresponse()
        assert (status.status, status.getheader("X-Jevany-Daemon-Error"), status.getheader("Retry-After")) == \
            (503, "worker_lost", "1")
        status.read()
        for conn in pending[1:]:       # the queued ones are scored by the replacement
            reply = conn.conn.getresponse()
            assert reply.status == 200
            reply.read()
    finally:
        for conn in pending:
            conn.close()
        try:
            os.kill(worker, signal.SIGCONT)
        except ProcessLookupError:
            pass

    # draining: 503 shutting_down, and /health says why
    with JevClient(daemon.control) as control:
        control.call("drain", {})
    status, headers, _ = post(BODY)
    assert (status, headers["x-jevany-daemon-error"]) == (503, "shutting_down")
    assert http.request("GET", "/health")[::2] == (503, {"status": "draining"})
    http.close()
    assert daemon.stop() == 0


def test_health_is_503_while_loading_then_200(start_daemon):
    daemon, port = http_daemon(start_daemon, readout="choice", ready=False)
    def worker_pid():
        try:
            return (daemon.status()["workers"] or [{}])[0].get("pid")
        except JevTimeoutError:      # no socket yet
            return None

    worker = wait_for(worker_pid, 60, "a worker started")
    raw = Raw(daemon.endpoint)
    os.kill(worker, signal.SIGSTOP)       # holds it loading, however fast the machine
    try:
        assert daemon.status()["state"] == "starting"
        wait_for(lambda: _health(port) is not None, 60, "the gateway up")
        http = Http(port)
        assert http.request("GET", "/health")[::2] == (503, {"status": "loading"})
        assert http.request("POST", "/v1/systemone", BODY)[::2] == (503, {"detail": "model is not ready"})
        assert http.request("GET", "/v1/models")[0] == 503
        raw.send("early", "decide", BODY)       # over ZeroMQ it queues for the model
    finally:
        os.kill(worker, signal.SIGCONT)
    wait_for(lambda: _health(port) == 200, 90, "/health ready once the model loaded")
    assert http.request("POST", "/v1/systemone", BODY)[0] == 200
    assert raw.recv()["ok"]
    raw.__exit__()
    # The early request's wait was the model's load: counted apart, out of the percentiles.
    assert {k: daemon.status()["latency_ms"][k] for k in ("samples", "waited_for_load")} == {
        "samples": 1, "waited_for_load": 1}
    http.close()
    assert daemon.stop() == 0


def test_a_token_guards_the_routes(start_daemon, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    daemon, port = http_daemon(start_daemon, "--http-token-file", str(token), readout="choice")
    http = Http(port)
    status, headers, _ = http.request("POST", "/v1/systemone", BODY)
    assert (status, headers["www-authenticate"]) == (401, "Bearer")
    assert http.request("POST", "/v1/systemone", BODY, headers={"Authorization": "Bearer nope"})[0] == 401
    assert http.request("POST", "/v1/systemone", BODY, headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert http.request("GET", "/v1/models")[0] == 401
    assert http.request("GET", "/health")[0] == 200          # probes need no secret; it says only ready or not
    # A browser's preflight carries no token: CORS answers it, outside the guard, and a refusal has CORS's headers.
    status, headers, _ = http.request("OPTIONS", "/v1/systemone", headers={
        "Origin": "https://page.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert status == 200 and headers["access-control-allow-origin"] in ("*", "https://page.example")
    status, headers, _ = http.request("POST", "/v1/systemone", BODY, headers={"Origin": "https://page.example"})
    assert status == 401 and "access-control-allow-origin" in headers
    http.close()
    assert daemon.stop() == 0


def test_http_and_zeromq_callers_share_batches(start_daemon, loaded_model):
    n, per = 16, 4
    daemon, port = http_daemon(start_daemon, "--max-batch-size", "32", "--batch-policy", "greedy",
                               readout="pointer")
    bodies = workloads.short(2 * n * per, seed=11)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    together = ctx.Barrier(2 * n)     # all connected before any sends, so both kinds are queued at once
    procs = []
    for k in range(n):
        mine = bodies[k * per:(k + 1) * per]
        procs.append(ctx.Process(target=decide_stream, args=(port, mine, k * per, queue, together)))
        theirs = bodies[(n + k) * per:(n + k + 1) * per]
        procs.append(ctx.Process(target=stream, args=(daemon.endpoint, theirs, (n + k) * per, queue, together)))
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        for index, *rest in queue.get(timeout=300):
            got[index] = rest[-1]
            if len(rest) == 2 and isinstance(rest[0], int):   # HTTP: (status, answer)
                assert rest[0] == 200, rest[1]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine

    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig())
    expected = [engine.decide(body) for body in bodies]
    report = compare(expected, [got[i] for i in range(len(bodies))])
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == []
    status = daemon.status()
    assert status["requests"]["decide_by_transport"] == {"zmq": n * per, "http": n * per}
    assert status["batching"]["mixed_transport_batches"] >= 1
    assert daemon.stop() == 0


def test_a_killed_gateway_fails_its_requests_cleanly_and_comes_back(start_daemon):
    daemon, port = http_daemon(start_daemon, "--max-batch-size", "8", readout="choice")
    ctx = mp.get_context("spawn")
    stop, queue = ctx.Event(), ctx.Queue()
    bodies = workloads.short(8, seed=5)
    procs = [ctx.Process(target=until_stopped, args=(port, BODY, f"http{k}", stop, queue)) for k in range(3)]
    from .client_proc import until_stopped as zmq_until_stopped
    procs += [ctx.Process(target=zmq_until_stopped, args=(daemon.endpoint, bodies, f"zmq{k}", stop, queue))
              for k in range(3)]
    for p in procs:
        p.start()
    try:
        wait_for(lambda: daemon.status()["requests"]["decide_by_transport"]["http"] >= 6, 60, "HTTP load")
        old = daemon.status()["http"]["pid"]
        killed_at = time.monotonic()
        os.kill(old, signal.SIGKILL)
        back = wait_for(lambda: (lambda h: h["pid"] not in (None, old) and _health(port) == 200 and h)(
            daemon.status()["http"]), 30, "a new gateway serving")
        back_in_s = time.monotonic() - killed_at
        before = daemon.status()["requests"]["decide_by_transport"]["http"]
        wait_for(lambda: daemon.status()["requests"]["decide_by_transport"]["http"] >= before + 6, 60,
                 "HTTP load through the new gateway")
    finally:
        stop.set()
    seen = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    print(f"gateway back in {back_in_s:.2f}s")
    assert back["restarts"] == 1 and back_in_s < 10
    for name, outcomes in seen.items():
        if name.startswith("zmq"):
            assert {o for o, _ in outcomes} == {"ok"}, outcomes      # ZeroMQ callers never noticed
        else:
            # in flight at the kill: a dropped connection, never a hang or a wrong answer
            assert set(outcomes) <= {200, "RemoteDisconnected", "ConnectionResetError", "IncompleteRead",
                                     "BrokenPipeError"}, outcomes
            assert outcomes[-1] == 200
    assert daemon.stop() == 0


_JSON = {"Content-Type": "application/json"}


def _json(body) -> bytes:
    import json

    return json.dumps(body).encode()


def test_health_is_503_while_the_only_worker_is_replaced(start_daemon):
    """A load balancer must hear that nothing can serve: requests would wait for the replacement to load."""
    daemon, port = http_daemon(start_daemon, readout="choice")
    [first] = [w["pid"] for w in daemon.status()["workers"]]
    os.kill(first, signal.SIGKILL)

    def replacement():
        pids = [w["pid"] for w in daemon.status()["workers"] if w["pid"] != first]
        return pids[0] if pids else None

    second = wait_for(replacement, 60, "a replacement worker started")
    os.kill(second, signal.SIGSTOP)       # holds it loading, however fast the machine
    try:
        wait_for(lambda: _health(port) == 503, 30, "/health 503 while no worker can serve")
        http = Http(port)
        assert http.request("GET", "/health")[::2] == (503, {"status": "loading"})
        status = daemon.status()
        assert status["state"] == "ready" and status["serving"] is False   # it queues requests; none runs now
    finally:
        os.kill(second, signal.SIGCONT)
    wait_for(lambda: _health(port) == 200, 90, "/health ready once the replacement loaded")
    http.close()
    assert daemon.stop() == 0
