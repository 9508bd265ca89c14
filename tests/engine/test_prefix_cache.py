"""The prefix cache: LRU within entry and byte bounds, and answers equal to computing every prefix."""
from types import SimpleNamespace

import pytest
import torch

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.prefix_cache import PrefixCache, cache_nbytes
from jevany_daemon.parity import compare

TOLERANCE = 1e-5


def fake_cache(nbytes: int):
    return SimpleNamespace(layers=[SimpleNamespace(keys=torch.zeros(nbytes, dtype=torch.uint8),
                                                   conv_states={0: None}, is_initialized=True)])


def test_hits_misses_and_least_recent_first_out():
    memory = PrefixCache(max_entries=2, max_bytes=1 << 20, min_tokens=2)
    a, b, c = (1, 2), (3, 4), (5, 6)
    assert memory.get(a) is None and memory.misses == 1
    memory.put(a, fake_cache(10))
    memory.put(b, fake_cache(10))
    assert memory.get(a) is not None and memory.hits == 1      # a is now the most recent
    memory.put(c, fake_cache(10))                                # evicts b, the least recent
    assert memory.keys() == [a, c] and memory.evictions == 1
    assert memory.get(b) is None
    assert memory.get((9,)) is None and memory.misses == 2       # too short to be cached: not even a miss
    assert memory.put((9,), fake_cache(1)) is False


def test_the_byte_bound_holds_under_a_flood_of_distinct_states():
    memory = PrefixCache(max_entries=1000, max_bytes=1000, min_tokens=1)
    for i in range(500):
        memory.put((i, i), fake_cache(64))
        assert memory.bytes <= 1000
    assert len(memory) == 1000 // 64 and memory.evictions == 500 - 1000 // 64
    assert memory.keys()[-1] == (499, 499)
    assert memory.put((7, 7, 7), fake_cache(2000)) is False      # bigger than the whole bound
    assert memory.bytes == cache_nbytes(fake_cache(64)) * len(memory)


def test_drop_and_clear():
    memory = PrefixCache(max_entries=4, max_bytes=1 << 20, min_tokens=1)
    for i in range(3):
        memory.put((i,), fake_cache(8))
    memory.drop((1,))
    assert memory.keys() == [(0,), (2,)] and memory.bytes == 16
    assert memory.clear() == 2 and len(memory) == 0 and memory.bytes == 0


REQUESTS = workloads.mixed(16, seed=5, max_words=30)
SAME_STATE = [{**REQUESTS[0], "questions": {"q": q}} for q in REQUESTS[0]["questions"].values()] * 2


def _engines(loaded_model, arch, readout):
    model = loaded_model(arch, readout)
    settings = EngineConfig(max_batch_size=16, max_padding_waste=1.0, batch_policy="greedy",
                            max_packed_tokens=1 << 16, prefix_cache=64, prefix_min_tokens=1)
    return Engine(model, EngineConfig(layout="rows", prefix_cache=0)), Engine(model, settings)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("readout", ["choice", "pointer", "lm_token"])
def test_cached_prefixes_give_the_answers_computing_them_gives(loaded_model, arch, readout):
    reference, cached = _engines(loaded_model, arch, readout)
    expected = [reference.score([reference.admit(b)])[0] for b in REQUESTS]
    first = cached.score([cached.admit(b) for b in REQUESTS[:10]])                  # all misses
    mixed = cached.score([cached.admit(b) for b in REQUESTS[5:] + REQUESTS[:5]])    # hits batched with misses
    assert cached.memory.hits >= 10 and cached.memory.misses >= 16
    assert any(r["batch"]["size"] > 1 for r in mixed)
    for report in (compare(expected[:10], first), compare(expected[5:] + expected[:5], mixed)):
        assert report["max_abs_diff"] <= TOLERANCE, report
        assert report["decisions_changed"] == []


def test_identical_prefixes_in_one_batch_are_computed_once(loaded_model):
    _, cached = _engines(loaded_model, "qwen3_5", "pointer")
    real, passes = cached._backbone, []

    def counting(**inputs):
        passes.append((inputs["input_ids"].shape[0], inputs.get("cache") is None))
        return real(**inputs)

    cached._backbone = counting
    results = cached.score([cached.admit(b) for b in SAME_STATE])
    assert len({r["batch"]["size"] for r in results}) == 1
    assert passes[0] == (1, True)                    # one prefix row for every request of that state
    assert len(cached.memory) == 1


def test_a_failed_pass_drops_the_prefixes_it_used(loaded_model):
    _, cached = _engines(loaded_model, "qwen3", "pointer")
    cached.score([cached.admit(b) for b in REQUESTS[:4]])
    assert len(cached.memory) == 4
    real = cached._backbone

    def fails_continuing(**inputs):
        if inputs.get("cache") is not None:
            raise RuntimeError("the branch pass broke")
        return real(**inputs)

    cached._backbone = fails_continuing
    outcomes = cached.score([cached.admit(b) for b in REQUESTS[:2]])
    assert all(not isinstance(o, dict) for o in outcomes)
    prefixes = {cached.admit(b).encoded.prefix for b in REQUESTS[:2]}
    assert not prefixes & set(cached.memory.keys())


def test_cached_rows_leave_no_query_without_a_key(loaded_model):
    """Rows put back together are left-padded again; under CUDA's attention that must stay finite."""
    from .cuda_like import cuda_like_sdpa

    _, cached = _engines(loaded_model, "qwen3_5", "choice")
    cached.score([cached.admit(b) for b in REQUESTS[:6]])
    with cuda_like_sdpa() as seen:
        results = cached.score([cached.admit(b) for b in REQUESTS])
    assert seen.calls > 0 and seen.dead_rows == 0
    assert all(isinstance(r, dict) for r in results)
    assert cached.stats.non_finite == 0


def test_only_prefixes_worth_caching_take_the_cached_path(loaded_model):
    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig(
        max_batch_size=16, prefix_cache=4, prefix_min_tokens=50, batch_policy="greedy", max_padding_waste=1.0,
        max_packed_tokens=1 << 16))
    short = workloads.short(4, seed=1)
    long = [{**body, "state": " ".join(["payment", "late"] * 40)} for body in workloads.short(3, seed=2)]
    results = engine.score([engine.admit(b) for b in short + long])
    assert engine.layout.name == "packed"                       # the configured layout still serves the rest
    assert [r["batch"]["size"] for r in results] == [4] * 4 + [3] * 3   # the two kinds never share a pass
    assert engine.prefix_cache_stats()["size"] == 1             # the three long ones share one state
    again = engine.score([engine.admit(b) for b in long])
    assert engine.prefix_cache_stats()["hits"] == 3
    assert [r["answers"] for r in again] == [r["answers"] for r in results[4:]]
