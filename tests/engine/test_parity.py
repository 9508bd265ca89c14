"""Batched and serial scoring agree; packed and rows agree where packed is enabled (FP32)."""
import pytest

from jevany_daemon import workloads
from jevany_daemon.parity import compare

REQUESTS = workloads.mixed(64, seed=7, max_words=30)
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
        ("qwen3_5", "choice", "rows"),
        ("qwen3_5", "pointer", "rows"),
    ],
)
def test_batched_equals_serial(make_engine, arch, readout, layout):
    engine = make_engine(arch, readout, layout=layout, max_batch_size=16, max_padding_waste=1.0, batch_policy="greedy",
                         max_packed_tokens=1 << 16)
    assert engine.layout.name == layout
    alone = serial(engine, REQUESTS)
    before = engine.stats.batches
    batched = engine.score([engine.admit(b) for b in REQUESTS])
    report = compare(alone, batched)
    assert report["max_abs_diff"] <= TOLERANCE, report
    assert report["decisions_changed"] == []
    assert report["probabilities"] > 64 * 2
    # the batched run really shared passes: 64 requests in at most 4 batches of 16 each
    assert engine.stats.batches - before == 4
    assert all(r["batch"]["size"] == 16 for r in batched)


@pytest.mark.parametrize("readout", ["choice", "pointer"])
def test_packed_equals_rows_on_qwen3(make_engine, readout):
    rows = make_engine("qwen3", readout, layout="rows", max_batch_size=8)
    packed = make_engine("qwen3", readout, layout="packed", max_batch_size=8)
    a = rows.score([rows.admit(b) for b in REQUESTS])
    b = packed.score([packed.admit(b) for b in REQUESTS])
    report = compare(a, b)
    assert report["max_abs_diff"] <= TOLERANCE, report
    assert report["decisions_changed"] == []
    # packed runs the shared state once, so it pads fewer tokens for multi-question requests
    assert packed.stats.padded_tokens < rows.stats.padded_tokens


def test_hybrid_models_refuse_packed(make_engine):
    with pytest.raises(ValueError, match="not proven"):
        make_engine("qwen3_5", "choice", layout="packed")
    assert make_engine("qwen3_5", "choice").layout.name == "rows"
    assert make_engine("qwen3", "choice").layout.name == "packed"
