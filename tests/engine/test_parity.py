"""Batched and serial scoring agree; packed and rows agree where packed is enabled (FP32).

The random tiny models cover every architecture, readout and layout; the
starter model (trained, right on most questions) makes "no decision
changed" guard decisions that mean something.
"""
import pytest

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.parity import compare
from jevany_daemon.starter import evaluate, suite

REQUESTS = workloads.mixed(24, seed=7, max_words=30)    # two passes of 12 batched
TOLERANCE = 1e-5


def serial(engine, bodies):
    return [engine.score([engine.admit(b)])[0] for b in bodies]


@pytest.mark.parametrize(
    "arch,readout,layout",
    [
        ("qwen3", "choice", "rows"),
        ("qwen3", "choice", "packed"),
        ("qwen3", "pointer", "rows"),
        ("qwen3", "pointer", "packed"),
        ("qwen3", "lm_token", "packed"),
        ("qwen3", "pointer", "shared"),
        ("qwen3_5", "choice", "rows"),
        ("qwen3_5", "pointer", "rows"),
        ("qwen3_5", "choice", "shared"),
        ("qwen3_5", "pointer", "shared"),
    ],
)
def test_batched_equals_serial(make_engine, arch, readout, layout):
    engine = make_engine(arch, readout, layout=layout, max_batch_size=12, max_padding_waste=1.0, batch_policy="greedy",
                         max_packed_tokens=1 << 16, prefix_cache=0)    # the cache's passes: test_prefix_cache.py
    assert engine.layout.name == layout
    alone = serial(engine, REQUESTS)
    before = engine.stats.batches
    batched = engine.score([engine.admit(b) for b in REQUESTS])
    report = compare(alone, batched)
    assert report["max_abs_diff"] <= TOLERANCE, report
    assert report["decisions_changed"] == []
    assert report["probabilities"] > len(REQUESTS) * 2
    # the batched run really shared passes: 24 requests in 2 batches of 12 each
    assert engine.stats.batches - before == len(REQUESTS) // 12
    assert all(r["batch"]["size"] == 12 for r in batched)


@pytest.mark.parametrize("arch,readout,layout", [
    ("qwen3", "choice", "packed"), ("qwen3", "pointer", "packed"), ("qwen3", "pointer", "shared"),
    ("qwen3_5", "pointer", "shared"), ("qwen3_5", "choice", "shared"),
])
def test_shared_state_layouts_equal_rows(make_engine, arch, readout, layout):
    rows = make_engine(arch, readout, layout="rows", max_batch_size=8, prefix_cache=0)
    shared = make_engine(arch, readout, layout=layout, max_batch_size=8, prefix_cache=0)
    a = rows.score([rows.admit(b) for b in REQUESTS])
    b = shared.score([shared.admit(b) for b in REQUESTS])
    report = compare(a, b)
    assert report["max_abs_diff"] <= TOLERANCE, report
    assert report["decisions_changed"] == []
    # running the shared state once pads fewer tokens for multi-question requests
    assert shared.stats.padded_tokens < rows.stats.padded_tokens


def test_the_trained_models_decisions_survive_batching_and_packing(trained_model):
    items = suite.read_jsonl(trained_model / "heldout.jsonl")[:48]
    bodies = [suite.body(item) for item in items]
    model = load_model(str(trained_model))
    results = {}
    for layout in ("rows", "packed"):
        engine = Engine(model, EngineConfig(layout=layout, max_batch_size=16, max_padding_waste=1.0,
                                            batch_policy="greedy", max_packed_tokens=1 << 16, prefix_cache=0))
        alone = serial(engine, bodies)
        before = engine.stats.batches
        results[layout] = engine.score([engine.admit(b) for b in bodies])
        assert engine.stats.batches - before == 3        # 48 requests really shared passes
        report = compare(alone, results[layout])
        assert report["max_abs_diff"] <= TOLERANCE and report["decisions_changed"] == [], report
    report = compare(results["rows"], results["packed"])
    assert report["max_abs_diff"] <= TOLERANCE and report["decisions_changed"] == [], report
    # the decisions guarded above are the model's real answers: mostly right, and not by chance
    assert evaluate.report(items, results["packed"])["overall"]["accuracy"] >= 0.85


def test_layout_choice(make_engine):
    with pytest.raises(ValueError, match="not proven"):
        make_engine("qwen3_5", "choice", layout="packed")
    assert make_engine("qwen3_5", "choice").layout.name == "shared"
    assert make_engine("qwen3", "choice").layout.name == "packed"
    assert make_engine("qwen3", "choice", layout="rows").layout.name == "rows"


def _result(**questions):
    return {"answers": {qid: {"type": "noul", "probabilities": dict(zip(("false", "true"), ps))}
                        for qid, ps in questions.items()}}


def test_compare_fails_on_a_nan_wherever_it_sits():
    # Python's max() keeps the first value when comparing with NaN: max([0.0, nan, 1e-9]) is 1e-9
    reference = [_result(a=(0.5, 0.5), b=(0.2, 0.8), c=(0.1, 0.9))]
    other = [_result(a=(0.5, 0.5), b=(float("nan"), 0.8), c=(0.1, 0.9 + 1e-9))]
    report = compare(reference, other)
    assert not report["max_abs_diff"] <= TOLERANCE
    assert report["non_finite"] == 1


def test_compare_fails_on_a_question_or_option_only_one_side_has():
    reference = [_result(a=(0.5, 0.5))]
    extra_question = [_result(a=(0.5, 0.5), z=(0.3, 0.7))]
    report = compare(reference, extra_question)
    assert report["mismatched"] == [(0, "z")] and not report["max_abs_diff"] <= TOLERANCE
    extra_option = [{"answers": {"a": {"type": "noul", "probabilities": {"false": 0.5, "true": 0.5, "x": 0.0}}}}]
    assert compare(reference, extra_option)["mismatched"] == [(0, "a")]
    assert compare(reference, reference)["max_abs_diff"] == 0.0
