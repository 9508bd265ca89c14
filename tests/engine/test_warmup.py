"""Warm-up: every path scored once before serving, and a model that cannot score stops the load."""
import pytest

from jevany_daemon.engine.warmup import WarmUpError, warm_up


def test_every_path_runs_and_leaves_no_trace(make_engine):
    engine = make_engine("qwen3_5", "pointer", layout="shared", max_batch_size=4, prefix_cache=0)
    seen = []
    engine.observer = seen.append
    paths = warm_up(engine)
    assert paths == ["1 question(s) alone", "2 question(s) alone", "batched"]
    assert [r.size for r in seen] == [1, 1, 2]          # three real passes, the last batched
    assert engine.stats.batches == 0 and engine.policy.rates == {}


def test_the_prefix_cache_path_is_warmed_then_emptied(make_engine):
    engine = make_engine("qwen3_5", "choice", max_batch_size=4, prefix_cache=4, prefix_min_tokens=64)
    paths = warm_up(engine)
    assert "2 question(s) alone, prefix cached" in paths
    head = engine.encoder.head
    # no state is kept; the prompt's head stays, computed once for good
    assert engine.prefix_cache_stats() | {"max_entries": 0, "bytes": 0} == {
        "enabled": True, "size": 0, "max_entries": 0, "bytes": 0, "max_bytes": 1 << 30, "min_tokens": 64,
        "hits": 0, "misses": 0, "evictions": 0, "reused_tokens": 0, "pinned_tokens": len(head)}
    assert engine.prefix_cache.pinned() == [head] and engine.prefix_cache.bytes > 0


def test_without_batching_there_is_no_batched_path(make_engine):
    assert "batched" not in warm_up(make_engine("qwen3", "choice", max_batch_size=1))


def test_a_model_that_scores_nan_fails_with_the_reason(make_engine):
    engine = make_engine("qwen3", "choice")
    real = engine.passes.backbone

    def nan(**inputs):
        out = real(**inputs)
        return (out[0] * float("nan"), out[1]) if isinstance(out, tuple) else out * float("nan")

    engine.passes.backbone = nan
    with pytest.raises(WarmUpError, match="non-finite"):
        warm_up(engine)


def test_a_failing_batched_pass_is_not_hidden_by_the_retry_alone(make_engine):
    engine = make_engine("qwen3", "choice", layout="packed", max_batch_size=4, prefix_cache=0)
    real = engine.passes.backbone

    def fails_batched(**inputs):
        if inputs["input_ids"].shape[0] > 1:
            raise RuntimeError("no kernel image is available for execution on the device")
        return real(**inputs)

    engine.passes.backbone = fails_batched
    with pytest.raises(WarmUpError, match="batched pass failed"):
        warm_up(engine)


def test_requests_the_limits_refuse_are_left_out(make_engine):
    # 2-question prompts exceed this, 1-question ones do not
    engine = make_engine("qwen3", "pointer", layout="rows", max_packed_tokens=40)
    paths = warm_up(engine)
    assert paths == ["1 question(s) alone"]
