"""Every error code this machine can produce, from a real client; the daemon keeps serving after each."""
import shutil
import tempfile
from pathlib import Path

import msgpack
import pytest
import zmq

from jevany_client import JevClient
from jevany_client.errors import (
    ContextLengthError,
    DeadlineExceededError,
    ForbiddenError,
    InvalidRequestError,
    ShuttingDownError,
    UnknownModelError,
)
from jevany_daemon import workloads
from jevany_daemon.parity import answer_problems, compare, non_finite

from .daemons import Daemon

GOOD = workloads.short(1, seed=2)[0]


class Raw:
    """A bare DEALER, for payloads JevClient would never send."""

    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 60_000)
        self.sock.connect(endpoint)

    def send(self, payload: bytes) -> dict:
        self.sock.send(payload)
        return msgpack.unpackb(self.sock.recv())

    def close(self):
        self.ctx.destroy(linger=0)


@pytest.fixture(scope="module")
def shared_daemon(tiny_model):
    # one daemon for the envelope errors: they never reach the worker
    d = Daemon(Path(tempfile.mkdtemp(prefix="jvd-")), tiny_model("qwen3", "pointer"), "--max-branch-tokens", "160")
    try:
        d.wait_ready()
        yield d
    finally:
        if d.proc.poll() is None:
            d.stop()
        shutil.rmtree(d.dir, ignore_errors=True)


def still_serves(daemon):
    with daemon.client(timeout=60) as client:
        assert set(client.call("decide", GOOD)["answers"]) == set(GOOD["questions"])


@pytest.mark.parametrize(
    "payload,code,echo",
    [
        (b"\xc1 not msgpack", "invalid_message", None),
        (msgpack.packb([1, 2, 3]), "invalid_message", None),
        (msgpack.packb({"v": 1, "op": "ping"}), "invalid_message", None),
        (msgpack.packb({"v": 1, "id": 1.5, "op": "ping"}), "invalid_message", None),
        (msgpack.packb({"v": 2, "id": "a", "op": "ping"}), "unsupported_version", "a"),
        (msgpack.packb({"v": 1, "id": 7, "op": "explode"}), "unknown_op", 7),
        (msgpack.packb({"v": 1, "id": "c", "op": "drain"}), "forbidden", "c"),
        (msgpack.packb({"v": 1, "id": "b", "op": "decide", "body": {"state": 1, "questions": {}}}),
         "invalid_request", "b"),
        (msgpack.packb({"v": 1, "id": "n", "op": "decide", "body": {"state": float("nan"), "questions": GOOD["questions"]}}),
         "invalid_request", "n"),
    ],
)
def test_envelope_and_body_errors(shared_daemon, payload, code, echo):
    raw = Raw(shared_daemon.endpoint)
    try:
        reply = raw.send(payload)
    finally:
        raw.close()
    assert reply["ok"] is False
    assert reply["error"]["code"] == code
    assert reply["id"] == echo
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"]
    assert reply["error"]["retryable"] is False
    still_serves(shared_daemon)


def test_errors_from_the_worker_come_back_typed(shared_daemon):
    with shared_daemon.client(timeout=60) as client:
        with pytest.raises(UnknownModelError) as err:
            client.call("decide", GOOD | {"model": "someone-else"})
        assert "this deployment serves" in err.value.message
        with pytest.raises(ContextLengthError):
            client.call("decide", {"state": "word " * 200, "questions": GOOD["questions"]})
        with pytest.raises(InvalidRequestError, match=r"^questions\.q\.criteria: must hold 1 to 4096 options, got 5000$"):
            client.call("decide", {"state": "s", "questions": {"q": {"type": "choice",
                                                                     "criteria": {f"o{i}": None for i in range(5000)}}}})
        with pytest.raises(ForbiddenError):
            client.call("reload")
    still_serves(shared_daemon)
    with JevClient(shared_daemon.control, timeout=10) as control:
        assert control.clear_cache() == {"cleared": 0}
    with shared_daemon.client() as client:
        status = client.status()
    assert status["requests"]["by_error_code"]["unknown_model"] >= 1
    assert status["requests"]["by_error_code"]["context_length_exceeded"] >= 1


def test_deadline_exceeded_is_never_scored(shared_daemon):
    with shared_daemon.client(timeout=60) as client:
        before = client.status()["batching"]["requests"]
        with pytest.raises(DeadlineExceededError) as err:
            client.call("decide", GOOD, timeout_ms=0)
        assert err.value.retryable
        assert client.status()["batching"]["requests"] == before
        assert client.call("decide", GOOD, timeout_ms=60_000)["answers"]


def test_overloaded_with_a_small_queue(start_daemon):
    daemon = start_daemon("--max-queue", "1")
    raw = Raw(daemon.endpoint)
    n = 30
    for i in range(n):
        raw.sock.send(msgpack.packb({"v": 1, "id": i, "op": "decide", "body": GOOD}))
    replies = [msgpack.unpackb(raw.sock.recv()) for _ in range(n)]
    raw.close()
    assert sorted(r["id"] for r in replies) == list(range(n))
    codes = [r["error"]["code"] for r in replies if not r["ok"]]
    assert codes and set(codes) == {"overloaded"}
    assert all(r["error"]["retryable"] for r in replies if not r["ok"])
    assert any(r["ok"] for r in replies)
    still_serves(daemon)
    daemon.stop()
    logged = [line for line in daemon.log.read_text().splitlines() if "event=overload" in line]
    assert 1 <= len(logged) < len(codes) and "count=1 " in logged[0]     # rate-limited, not one per reject


def test_an_oversized_message_gets_a_clear_error_not_a_timeout(start_daemon):
    daemon = start_daemon("--max-message-bytes", "100000")
    with daemon.client(timeout=30) as client:
        # a typed error, not the JevTimeoutError a message ZeroMQ dropped would end in
        with pytest.raises(InvalidRequestError, match=r"accepts at most 100,000 \(its --max-message-bytes"):
            client.call("decide", {**GOOD, "state": "x" * 150_000})
        assert client.ping()["pong"] is True
    assert daemon.stop() == 0


def test_shutting_down_after_drain(start_daemon):
    daemon = start_daemon()
    with JevClient(daemon.control, timeout=60) as control:
        assert control.drain() == {"state": "drained"}
    with daemon.client(timeout=60) as client:
        with pytest.raises(ShuttingDownError) as err:
            client.call("decide", GOOD)
        assert err.value.retryable and "drained" in err.value.message
        assert client.status()["state"] == "drained"       # the drain finished; it is not still going
        assert client.ping()["pong"] is True
    assert daemon.stop() == 0


def _nan_for_one_word(model_dir: Path, out: Path, loaded_model, others: list) -> tuple[Path, str]:
    """A copy of the tiny pointer model whose embedding is NaN for one word none of `others` uses.

    A real model fault, no code injected: every pass holding that word comes
    out NaN in that request's row alone (rows of a batch never mix).
    """
    from safetensors.torch import load_file, save_file
    import torch

    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine

    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig())

    def ids(body):
        enc = engine.admit(body).encoded
        return set(enc.prefix) | {t for b in enc.branches for t in b.tokens}

    used = set().union(*map(ids, others))
    word, poisoned = next((w, ids(_naming(w)) - used) for w in ("calibration", "punctuation", "explanation")
                          if ids(_naming(w)) - used)
    shutil.copytree(model_dir, out)
    weights = load_file(out / "base" / "model.safetensors")
    weights["model.embed_tokens.weight"][sorted(poisoned)] = float("nan")
    save_file(weights, out / "base" / "model.safetensors", metadata={"format": "pt"})
    assert torch.isnan(load_file(out / "base" / "model.safetensors")["model.embed_tokens.weight"]).any()
    return out, word


def _naming(word: str) -> dict:
    return {"state": {"ticket": word}, "questions": {"q": {"type": "noul", "instructions": "urgent?"}}}


def test_a_non_finite_answer_is_internal_for_its_request_alone(start_daemon, tiny_model, loaded_model, tmp_path):
    mates = workloads.short(7, seed=30)
    model, word = _nan_for_one_word(tiny_model("qwen3", "pointer"), tmp_path / "nan-word", loaded_model, mates)
    daemon = start_daemon("--max-batch-size", "8", "--batch-policy", "greedy", "--max-padding-waste", "1",
                          model=model)
    bodies = mates[:3] + [_naming(word)] + mates[3:]
    raw = Raw(daemon.endpoint)
    try:
        for i, body in enumerate(bodies):
            raw.sock.send(msgpack.packb({"v": 1, "id": i, "op": "decide", "body": body}))
        replies = {r["id"]: r for r in (msgpack.unpackb(raw.sock.recv()) for _ in bodies)}
    finally:
        raw.close()
    assert non_finite(list(replies.values())) == []          # nothing non-finite on the wire
    bad = replies.pop(3)
    assert bad["ok"] is False and bad["error"]["code"] == "internal" and bad["error"]["retryable"] is False
    assert "non-finite" in bad["error"]["message"]
    assert all(r["ok"] for r in replies.values()), replies
    got = [replies[i]["result"] for i in sorted(replies)]
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine

    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig())
    report = compare([engine.decide(b) for b in mates], got)
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == []
    assert [p for body, r in zip(mates, got) for p in answer_problems(body, r)] == []
    status = daemon.status()
    assert status["batching"]["non_finite"] >= 1 and status["requests"]["by_error_code"] == {"internal": 1}
    assert status["workers"][0]["restarts"] == 0
    still_serves(daemon)
    assert daemon.stop() == 0


def test_a_control_op_on_the_public_socket_says_where_it_goes(shared_daemon):
    # a client on this host (an ipc socket) is told the control endpoint's address and the command
    raw = Raw(shared_daemon.endpoint)
    try:
        reply = raw.send(msgpack.packb({"v": 1, "id": "d", "op": "clear_cache"}))
    finally:
        raw.close()
    assert reply["error"]["code"] == "forbidden"
    assert reply["error"]["message"] == (f"clear_cache is a control op; send it to this daemon's control endpoint, "
                                         f"{shared_daemon.control}: jevany-ctl clear-cache --control "
                                         f"{shared_daemon.control}")


class _Refusals:
    def __init__(self, gateway=None):
        self.gateway, self.said = gateway, []

    def transport(self, sock):
        return "http" if sock is self.gateway else "zmq"

    def refuse(self, sock, envelope, op, request_id, exc):
        self.said.append((exc.code, exc.message))


@pytest.mark.parametrize("bound,control,said", [
    ("tcp://127.0.0.1:*", "ipc:///run/u/jevany/control.sock",
     "drain is a control op; send it to the daemon's control endpoint, not this one: "
     "jevany-ctl drain --control ADDRESS, on the daemon's host"),
    ("ipc://{tmp}/http.sock", "ipc:///run/u/jevany/control.sock",       # the HTTP gateway's: anyone's requests
     "drain is a control op; send it to the daemon's control endpoint, not this one: "
     "jevany-ctl drain --control ADDRESS, on the daemon's host"),
    ("tcp://127.0.0.1:*", "",
     "drain is a control op, and this daemon's control endpoint is off (--control ''): the operator must "
     "restart it with --control ADDRESS to take control ops"),
], ids=["tcp", "http", "control-off"])
def test_the_control_address_is_said_only_to_a_client_on_this_host(tmp_path, bound, control, said):
    from types import SimpleNamespace

    from jevany_daemon.server.client_ops import ClientOps
    from jevany_daemon.server.settings import ServeSettings

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(bound.format(tmp=tmp_path))
    try:
        refusals = _Refusals(gateway=sock if "http" in bound else None)
        settings = ServeSettings(control=control)
        ops = ClientOps(clock=lambda: 0.0, run_state=None, queue=None, media=None, gather=None, overloads=None,
                        pool=None, clears=None, reloads=None, control=object(), replies=refusals,
                        status=SimpleNamespace(settings=lambda: settings), begin_drain=None)
        ops.handle(sock, [b"peer"], msgpack.packb({"v": 1, "id": "d", "op": "drain"}))
    finally:
        sock.close()
        ctx.term()
    assert refusals.said == [("forbidden", said)]
