"""The engine's promises: limits reject, failures stay with their cause, threads get their own answers."""
import math
import threading
import time

import pytest

from jevany_client.errors import (
    ContextLengthError,
    InternalError,
    InvalidRequestError,
    UnknownModelError,
    UnsupportedMediaError,
)
from jevany_daemon import workloads
from jevany_daemon.config import CPU_PADDING_WASTE, GPU_PADDING_WASTE, EngineConfig, default_padding_waste
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.stats import BatchRecord, BatchStats
from jevany_daemon.parity import answer_problems, compare

BODY = {"state": {"note": "order late"}, "questions": {"q": {"type": "noul", "instructions": "refund?"}}}


def test_result_envelope(make_engine):
    engine = make_engine(prefix_cache=0)    # the configured layout runs it, so its shape says what a pass pads
    body = workloads.mixed(1, seed=3)[0] | {"model": "jevany-latest"}
    shape = engine.layout.shape(engine.admit(body).encoded)
    result = engine.decide(body)
    assert result["model"] == engine.model.model_id
    assert set(result) == {"model", "answers", "usage", "latency_ms", "batch"}
    assert result["usage"]["input_tokens"] > 0 and result["usage"]["output_tokens"] > 0
    assert result["batch"] == {"size": 1, "padded_tokens": shape.rows * shape.width + shape.prefix}
    assert answer_problems(body, result) == []
    for answer in result["answers"].values():
        assert math.isclose(sum(answer["probabilities"].values()), 1.0, abs_tol=1e-6)


def test_model_selector(make_engine):
    engine = make_engine()
    assert engine.decide(BODY | {"model": engine.model.model_id})["model"] == engine.model.model_id
    with pytest.raises(UnknownModelError, match="this deployment serves"):
        engine.decide(BODY | {"model": "other-model"})


def test_the_names_the_docs_give_the_current_model_are_admitted_and_no_other(make_engine):
    # docs/JEV-API.md: jev-latest (typesafe-sdk's default), jev-preview, jevany-latest and the model's own name;
    # a caller pointed here unchanged sends the first.
    engine = make_engine()
    for name in ("jev-latest", "jev-preview", "jevany-latest", engine.model.model_id):
        assert engine.admit(BODY | {"model": name}).request.model == name
    for name in ("jev-2", "jev-latest-preview", "JEV-LATEST"):
        with pytest.raises(UnknownModelError, match="this deployment serves"):
            engine.admit(BODY | {"model": name})


def test_busy_s_is_the_seconds_spent_in_passes(make_engine):
    stats = BatchStats()
    stats.record(BatchRecord(size=2, padded_tokens=16, real_tokens=12, latency_ms=250.0, ok=True))
    assert stats.as_dict()["busy_s"] == 0.25
    engine = make_engine()
    started = time.monotonic()
    engine.decide(BODY)
    wall_s = time.monotonic() - started
    assert 0 < engine.stats.as_dict()["busy_s"] <= wall_s        # a pass's time is within the call's


@pytest.mark.parametrize("readout,message", [("choice", "choice readout does not support media requests"),
                                             ("pointer", "checkpoint does not support the requested media type")])
def test_media_on_a_text_model_in_jevany_words(make_engine, readout, message):
    with pytest.raises(UnsupportedMediaError) as err:
        make_engine("qwen3", readout).decide(BODY | {"media": [{"type": "image", "uri": "a.png"}]})
    assert err.value.message == message


@pytest.mark.parametrize("readout,limit,words", [
    ("choice", 52, "exact choice-token readout supports at most 52 options"),
    ("lm_token", 255, "lm-token mode supports at most 255 options per question")])
def test_option_caps_per_readout(make_engine, readout, limit, words):
    engine = make_engine("qwen3", readout)
    assert engine.readout.max_options == limit
    names = [f"option{i}" for i in range(limit + 1)]
    fits = {"state": "s", "questions": {"q": {"type": "choice", "criteria": dict.fromkeys(names[:limit])}}}
    assert len(engine.decide(fits)["answers"]["q"]["probabilities"]) == limit
    over = {"state": "s", "questions": {"q": {"type": "choice", "criteria": dict.fromkeys(names)}}}
    with pytest.raises(InvalidRequestError) as err:
        engine.decide(over)
    assert err.value.message == f"questions.q: {words} (got {limit + 1})"     # JevAny's words, and which question


@pytest.mark.parametrize("readout", ["choice", "pointer"])
def test_limits_reject_and_never_truncate(make_engine, readout):
    long_state = {"state": " ".join(["payment"] * 300), "questions": BODY["questions"]}
    engine = make_engine("qwen3", readout, max_state_tokens=64, max_branch_tokens=64)
    with pytest.raises(ContextLengthError):
        engine.decide(long_state)
    assert engine.stats.batches == 0   # nothing reached the model
    roomy = make_engine("qwen3", readout)
    assert roomy.decide(long_state)["usage"]["input_tokens"] > 300


def test_limit_messages_follow_jevany(make_engine):
    pointer = make_engine("qwen3", "pointer", max_state_tokens=10)
    with pytest.raises(ContextLengthError, match=r"^state exceeds 10 tokens: (at least )?\d+$"):
        pointer.admit({"state": "word " * 40, "questions": BODY["questions"]})
    branch = make_engine("qwen3", "pointer", max_branch_tokens=20)
    with pytest.raises(ContextLengthError, match=r"^branch too long: (at least )?\d+ tokens \(limit: 20\)$"):
        branch.admit({"state": "s", "questions": {"q": {"type": "noul", "instructions": "why " * 40}}})
    packed = make_engine("qwen3", "pointer", max_packed_tokens=30)
    many = {f"q{i}": {"type": "noul", "instructions": "refund now"} for i in range(6)}
    with pytest.raises(ContextLengthError, match=r"^request exceeds 30 packed tokens: \d+$"):
        packed.admit({"state": "s", "questions": many})
    choice = make_engine("qwen3", "choice", max_branch_tokens=20)
    with pytest.raises(ContextLengthError, match=r"^the choice readout's prompt needs (at least )?\d+ tokens including the answer; limit 20$"):
        choice.admit(BODY)


def test_a_request_of_exactly_max_packed_tokens_is_admitted_and_one_more_is_refused(make_engine):
    # max_packed_tokens is what one pass may allocate: a request that fills it exactly runs, and the
    # operator who sized it to the largest request they send must not see that request refused.
    many = {f"q{i}": {"type": "noul", "instructions": "refund now"} for i in range(6)}
    body = {"state": "s", "questions": many}
    roomy = make_engine("qwen3", "pointer")
    shape = roomy.layout.shape(roomy.admit(body).encoded)
    cost = shape.rows * shape.width + shape.prefix
    assert make_engine("qwen3", "pointer", max_packed_tokens=cost).admit(body)
    with pytest.raises(ContextLengthError, match=rf"^request exceeds {cost - 1} packed tokens: {cost}$"):
        make_engine("qwen3", "pointer", max_packed_tokens=cost - 1).admit(body)


def test_the_state_limit_holds_for_the_choice_prompt_too(make_engine):
    """Its state sits inside a chat message, but max_state_tokens still counts the state's own tokens."""
    engine = make_engine("qwen3", "choice", max_state_tokens=64)
    with pytest.raises(ContextLengthError, match=r"^state exceeds 64 tokens: (at least )?\d+$"):
        engine.admit({"state": " ".join(["payment"] * 500), "questions": BODY["questions"]})
    tight = make_engine("qwen3", "choice", max_state_tokens=10)
    with pytest.raises(ContextLengthError, match=r"^state exceeds 10 tokens: \d+$"):   # counted exactly
        tight.admit({"state": "payment " * 20, "questions": BODY["questions"]})
    assert engine.admit({"state": "payment " * 20, "questions": BODY["questions"]})   # 20 words fit in 64


def test_limits_are_capped_by_the_context_window(make_engine):
    engine = make_engine(max_state_tokens=1 << 20, max_branch_tokens=1 << 20)
    window = engine.model.context_window
    assert engine.limits.state == window and engine.limits.branch == window


def test_batches_respect_size_and_padded_token_limits(loaded_model):
    bodies = workloads.short(40, seed=11)
    by_size, by_tokens = [], []
    sized = Engine(loaded_model("qwen3", "pointer"),
                   EngineConfig(max_batch_size=5, max_packed_tokens=1 << 16, max_padding_waste=1.0,
                                batch_policy="greedy"),
                   observer=by_size.append)
    sized.score([sized.admit(b) for b in bodies])
    assert sum(r.size for r in by_size) == 40
    assert max(r.size for r in by_size) == 5 and len(by_size) == 8

    budget = Engine(loaded_model("qwen3", "pointer"),
                    EngineConfig(max_batch_size=64, max_packed_tokens=600, max_padding_waste=1.0,
                                 batch_policy="greedy"),
                    observer=by_tokens.append)
    budget.score([budget.admit(b) for b in bodies])
    assert sum(r.size for r in by_tokens) == 40
    assert all(r.padded_tokens <= 600 for r in by_tokens)
    assert 1 < len(by_tokens) < 40     # the token budget, not the size cap, split the queue


def test_grouping_by_length_wastes_less_padding(loaded_model):
    bodies = workloads.long_uneven(32, seed=5)
    waste = {}
    for cap in (1.0, 0.2):
        engine = Engine(loaded_model("qwen3", "choice"),
                        EngineConfig(max_batch_size=8, max_packed_tokens=1 << 16, max_padding_waste=cap,
                                     batch_policy="greedy", prefix_cache=0))   # every request in one layout
        engine.score([engine.admit(b) for b in bodies])
        waste[cap] = engine.stats.as_dict()["padding_waste"]
    assert waste[0.2] < waste[1.0]
    assert waste[0.2] <= 0.2


def test_a_failing_request_fails_alone_and_costs_its_neighbours_a_few_passes(make_engine, monkeypatch):
    # One request that breaks every pass it joins: its batch is retried in halves, so the other fifteen
    # are answered within 2·log2(16) passes more; retried one by one, they took 16.
    engine = make_engine("qwen3", "pointer", max_batch_size=16, max_padding_waste=1.0, batch_policy="greedy")
    bodies = workloads.mixed(15, seed=21)
    poison = {"state": "zebra", "questions": BODY["questions"]}
    admitted = [engine.admit(b) for b in bodies[:4]] + [engine.admit(poison)] + [engine.admit(b) for b in bodies[4:]]
    poison = list(admitted[4].encoded.prefix)
    real_backbone = engine.passes.backbone
    passes = []

    def holds_poison(row: list[int]) -> bool:
        # packed layout: a request's state and questions lie together somewhere in a row
        return any(row[i:i + len(poison)] == poison for i in range(len(row) - len(poison) + 1))

    def evil_backbone(**inputs):
        passes.append(inputs["input_ids"].shape[0])
        if any(holds_poison(row) for row in inputs["input_ids"].tolist()):
            raise RuntimeError("injected fault")
        return real_backbone(**inputs)

    monkeypatch.setattr(engine.passes, "backbone", evil_backbone)
    outcomes = engine.score(admitted)
    assert isinstance(outcomes[4], InternalError) and "injected fault" in outcomes[4].message
    good = outcomes[:4] + outcomes[5:]
    assert all(isinstance(o, dict) for o in good)
    assert len(passes) <= 1 + 2 * 4, passes                     # the first pass, then two per halving
    monkeypatch.setattr(engine.passes, "backbone", real_backbone)
    alone = [engine.score([engine.admit(b)])[0] for b in bodies]
    assert compare(alone, good)["max_abs_diff"] <= 1e-5
    assert engine.stats.retried == 16 + 8 + 4 + 2                # the poison's half, each time


def test_idle_engine_scores_a_lone_request_at_once(make_engine):
    engine = make_engine(max_batch_size=32)
    result = engine.decide(BODY)
    assert result["batch"]["size"] == 1
    assert engine.stats.as_dict()["batch_size_histogram"] == {"1": 1}


def test_threads_get_their_own_answers(make_engine):
    engine = make_engine("qwen3", "pointer", max_batch_size=8)
    bodies = workloads.mixed(48, seed=33)
    expected = [engine.score([engine.admit(b)])[0] for b in bodies]
    got, errors = {}, []

    def worker(start):
        try:
            for i in range(start, len(bodies), 6):
                got[i] = engine.decide(bodies[i])
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    report = compare(expected, [got[i] for i in range(len(bodies))])
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == []
    assert [p for i, body in enumerate(bodies) for p in answer_problems(body, got[i])] == []


def test_describe(make_engine):
    d = make_engine("qwen3", "pointer", max_batch_size=4).describe()
    assert d["readout"] == "pointer" and d["layout"] == "packed"
    assert d["aliases"] == ["jevany-latest"] and d["random_weights"] is False   # only the built-in demo is
    assert d["limits"]["max_batch_size"] == 4
    assert d["batching"]["batches"] == 0


def test_padding_cap_defaults_by_device(make_engine):
    # CPU: padded tokens cost like real ones, so the default cap is tight (config.py says why)
    assert make_engine("qwen3", "pointer").describe()["limits"]["max_padding_waste"] == CPU_PADDING_WASTE
    assert make_engine("qwen3", "pointer", max_padding_waste=0.7).batch_limits.max_padding_waste == 0.7
    assert default_padding_waste("cuda") == GPU_PADDING_WASTE > CPU_PADDING_WASTE
