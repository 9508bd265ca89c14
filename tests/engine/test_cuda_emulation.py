"""Batched scoring under CUDA's attention behaviour: finite, and equal to serial.

A NaN at a padded position spreads: through later attention layers (its
value is multiplied by a zero weight, and 0 x NaN is NaN) and, on hybrid
models, through the linear-attention recurrence into every real token of
its row. The qwen3_5 model here has the real model's pattern (8 layers,
3 linear : 1 full), so a full-attention layer feeds a recurrence.
"""
import math

import pytest
import torch

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model
from jevany_daemon.parity import compare

from .cuda_like import cuda_like_sdpa

REQUESTS = workloads.mixed(16, seed=11, max_words=30)
TOLERANCE = 1e-5
CASES = [
    (arch, readout, layout)
    for arch in ("qwen3", "qwen3_5")
    for readout in ("choice", "pointer", "lm_token")
    for layout in ("rows", "packed", "shared", "cached")
    if not (arch == "qwen3_5" and layout == "packed")     # never proven for recurrent layers
]


def _engine(model, layout: str) -> Engine:
    """A layout with the prefix cache off; "cached": the prefix cache's passes, every state kept."""
    cache = {"prefix_cache": len(REQUESTS), "prefix_min_tokens": 1} if layout == "cached" else {"prefix_cache": 0}
    return Engine(model, EngineConfig(layout="auto" if layout == "cached" else layout, max_batch_size=len(REQUESTS),
                                      max_padding_waste=1.0, batch_policy="greedy", max_packed_tokens=1 << 16,
                                      **cache))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache = {}

    def get(arch: str, readout: str):
        if (arch, readout) not in cache:
            shape = "tiny8" if arch == "qwen3_5" else "tiny"
            out = tmp_path_factory.mktemp(f"emul-{arch}-{readout}")
            build_tiny_model(out, arch=arch, readout=readout, shape=shape)
            cache[arch, readout] = load_model(str(out), device="cpu", dtype="fp32")
        return cache[arch, readout]

    return get


@pytest.fixture(scope="module")
def serial(models):
    """Each request scored alone (rows: exact everywhere), under the emulation too; once per model."""
    cache = {}

    def get(arch: str, readout: str):
        if (arch, readout) not in cache:
            engine = _engine(models(arch, readout), "rows")
            with cuda_like_sdpa():
                cache[arch, readout] = [engine.score([engine.admit(b)])[0] for b in REQUESTS]
        return cache[arch, readout]

    return get


def _probabilities(results: list) -> list[float]:
    return [p for r in results for a in r["answers"].values() for p in a["probabilities"].values()]


def test_the_emulation_turns_a_row_with_no_key_into_nan():
    q = k = v = torch.ones(1, 1, 2, 4)
    mask = torch.tensor([[[[False, False], [True, True]]]])
    with cuda_like_sdpa() as seen:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.isnan(out[0, 0, 0]).all() and torch.isfinite(out[0, 0, 1]).all()
    assert seen.dead_rows == 1
    additive = torch.zeros(1, 1, 2, 2).masked_fill(~mask, torch.finfo(torch.float32).min)
    with cuda_like_sdpa():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    assert torch.isnan(out[0, 0, 0]).all()


@pytest.mark.parametrize("arch,readout,layout", CASES)
def test_batched_equals_serial_under_cuda_attention(models, serial, arch, readout, layout):
    alone = serial(arch, readout)
    engine = _engine(models(arch, readout), layout)
    with cuda_like_sdpa() as seen:
        batched = engine.score([engine.admit(b) for b in REQUESTS])
        if layout == "cached":     # the same again: every state a hit, continued from left-padded rows
            batched = engine.score([engine.admit(b) for b in REQUESTS])
            assert engine.prefix_cache.hits >= len(REQUESTS) // 2
    assert seen.calls > 0                                # the emulation sat in the attention path
    assert all(isinstance(r, dict) for r in alone + batched), [r for r in alone + batched if not isinstance(r, dict)]
    assert all(r["batch"]["size"] == len(REQUESTS) for r in batched)   # one pass, not rescored alone
    assert engine.stats.retried == 0
    assert all(math.isfinite(p) for p in _probabilities(alone) + _probabilities(batched))
    report = compare(alone, batched)
    # `pytest -s` prints the emulated parity table
    print(f"\nemulated CUDA attention, {arch} {readout} {layout}: {len(REQUESTS)} requests in one pass, "
          f"max |dp| {report['max_abs_diff']:.2e}, {len(report['decisions_changed'])} decisions changed, "
          f"{report['non_finite']} non-finite, {seen.dead_rows} query rows with no key")
    assert report["max_abs_diff"] <= TOLERANCE, report
    assert report["decisions_changed"] == []
    assert report["non_finite"] == 0 and seen.dead_rows == 0
