"""The host's side of a pass, counted: what decides GPU throughput, held on a CPU.

Per pass: one upload, one download (the one device sync), no scalar read
(.item(), bool(tensor): each a sync on CUDA) in or out of the forward, one
forward for misses and hits alike on both architectures (kept states on a
hybrid model excepted: their recurrent state needs a pass that ends with
them), and bookkeeping ops outside the forward that grow neither with the
requests nor with the depth. Cached entries are read, never written.
"""
import gc
import time
import weakref
from contextlib import contextmanager

import pytest
import torch

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.probe import Probe
from jevany_daemon.parity import compare

from .cuda_like import cuda_like_sdpa

GREEDY = dict(batch_policy="greedy", max_padding_waste=1.0, max_batch_size=32)


def counted(engine, bodies):
    """One pass of bodies under the probe: (counts, stream counters before and after, outcomes)."""
    probe = Probe(engine)
    before, passes = engine.stream.counters(), engine.stats.batches
    with probe.active():
        outcomes = engine.score(engine.admit_many(bodies))
    assert engine.stats.batches - passes == 1
    assert all(isinstance(o, dict) for o in outcomes), outcomes
    after = engine.stream.counters()
    return probe.counts, after["uploads"] - before["uploads"], after["downloads"] - before["downloads"]


@contextmanager
def caches_given(engine, read):
    """A list of read(the decoder cache) for every backbone call while inside (None for a call without one)."""
    backbone, given = engine.model.backbone, []
    original = backbone.forward

    def forward(*args, **kwargs):
        cache = kwargs.get("cache")
        given.append(None if cache is None else read(cache))
        return original(*args, **kwargs)

    backbone.forward = forward
    try:
        yield given
    finally:
        backbone.forward = original


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_pass_of_misses_and_of_hits_is_one_forward_one_upload_one_sync(loaded_model, arch):
    engine = Engine(loaded_model(arch, "choice"), EngineConfig(**GREEDY, prefix_min_tokens=200))
    engine.score(engine.admit_many(workloads.short(2, seed=1)))       # pins the prompt's head
    short = workloads.short(16, seed=3)                               # never kept: 1-2 questions each
    long = [{**b, "state": " ".join(["refund", "late"] * 60)} for b in workloads.short(4, seed=4)]
    for bodies in (short, long, long):                                # misses, kept misses, hits
        counts, uploads, downloads = counted(engine, bodies)
        assert (uploads, downloads, counts.scalar_reads) == (1, 1, 0)
        kept_miss = bodies is long and counts.forwards > 1
        assert counts.forwards == (2 if kept_miss else 1), counts
        assert not kept_miss or arch == "qwen3_5"                     # attention-only models keep in one forward
    assert engine.prefix_cache.hits >= 1


def test_ops_outside_the_forward_grow_neither_with_requests_nor_with_depth(tiny_model, tmp_path):
    from jevany_daemon.model.loading import load_model
    from jevany_daemon.model.tiny import build_tiny_model

    deeper = build_tiny_model(tmp_path / "tiny8", arch="qwen3_5", readout="choice", shape="tiny8")
    outside = {}
    for name, path in (("4 layers", tiny_model("qwen3_5", "choice")), ("8 layers", deeper)):
        engine = Engine(load_model(str(path), device="cpu"), EngineConfig(**GREEDY))
        engine.score(engine.admit_many(workloads.short(2, seed=1)))
        for n in (4, 16):
            counts, _, _ = counted(engine, [{**b, "questions": dict(list(b["questions"].items())[:1])}
                                            for b in workloads.short(n, seed=n)])
            outside[name, n] = counts.ops_outside
    assert len(set(outside.values())) == 1, outside
    assert max(outside.values()) <= 400


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_cached_entries_are_never_written_by_the_passes_that_read_them(loaded_model, arch):
    engine = Engine(loaded_model(arch, "choice"), EngineConfig(**GREEDY, prefix_min_tokens=200))
    long = [{**b, "state": " ".join(["parcel", "lost"] * 60)} for b in workloads.short(2, seed=5)]
    engine.score(engine.admit_many(long))
    snapshot = [(e, [t.clone() for t in (e.cache.kv, e.cache.conv, e.cache.recurrent) if t is not None])
                for e in engine.prefix_cache.entries()]
    assert len(snapshot) == 2                                          # the head and the long state
    for bodies in (long[:1], long, workloads.short(1, seed=6), workloads.short(5, seed=7)):   # alone and together
        engine.score(engine.admit_many(bodies))
    for entry, tensors in snapshot:
        assert any(entry is kept for kept in engine.prefix_cache.entries())     # still held, not replaced
        now = [t for t in (entry.cache.kv, entry.cache.conv, entry.cache.recurrent) if t is not None]
        assert all(torch.equal(a, b) for a, b in zip(tensors, now)), entry.pinned


def test_rows_continuing_the_head_read_its_recurrent_states_where_they_are_kept(loaded_model):
    """No copy of the head's recurrent states into a pass (18 layers x 50 rows at Qwen3.5's depth: most of
    a gigabyte at 0.8B in FP32), nor of the pass's final states over them: the layers are handed views."""
    engine = Engine(loaded_model("qwen3_5", "choice"), EngineConfig(**GREEDY))
    engine.score(engine.admit_many(workloads.short(2, seed=1)))       # pins the prompt's head
    head = next(e.cache.recurrent for e in engine.prefix_cache.entries() if e.pinned)
    recurrent = lambda cache: [layer.recurrent_states[0] for layer in cache.layers
                               if isinstance(getattr(layer, "recurrent_states", None), dict)]
    with caches_given(engine, recurrent) as given:
        outcomes = engine.score(engine.admit_many(workloads.short(8, seed=2)))
    assert all(isinstance(o, dict) for o in outcomes)
    [states] = given
    assert states and all(s.shape[0] >= 8 and s.untyped_storage().data_ptr() == head.untyped_storage().data_ptr()
                          for s in states)
    # One row alone gets its own copy: its view would be the entry itself, contiguous, which a kernel
    # that writes its starting state in place would not copy first (cache_rows._joined_states).
    with caches_given(engine, recurrent) as given:
        assert all(isinstance(o, dict) for o in engine.score(engine.admit_many(workloads.short(1, seed=3))))
    [states] = given
    assert states and all(s.shape[0] == 1 and s.untyped_storage().data_ptr() != head.untyped_storage().data_ptr()
                          for s in states)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_pass_frees_its_joined_cache_without_the_garbage_collector(loaded_model, arch):
    """A worker's heap is frozen and full collections are rare: a cycle through a joined cache would keep
    every pass's keys, values and states alive until one came (once, it doubled the host time of hits)."""
    engine = Engine(loaded_model(arch, "choice"), EngineConfig(**GREEDY, prefix_min_tokens=200))
    long = [{**b, "state": " ".join(["parcel", "lost"] * 60)} for b in workloads.short(4, seed=5)]
    engine.score(engine.admit_many(long))                             # kept: the next pass joins them
    references = lambda cache: [weakref.ref(cache)] + [weakref.ref(layer) for layer in cache.layers]
    gc.disable()
    try:
        with caches_given(engine, references) as given:
            for bodies in (long, workloads.short(4, seed=6)):        # kept states, the pinned head
                assert all(isinstance(o, dict) for o in engine.score(engine.admit_many(bodies)))
        caches = [refs for refs in given if refs is not None]
        assert len(caches) == 2 and all(ref() is None for refs in caches for ref in refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_continuing_the_head_alone_or_together_gives_the_answers_of_rows(loaded_model, arch):
    """Default settings: states too short to keep continue the pinned head, each row computing its own."""
    model = loaded_model(arch, "choice")
    rows = Engine(model, EngineConfig(layout="rows", prefix_cache=0))
    bodies = workloads.mixed(8, seed=5, max_words=30)
    expected = [rows.score([rows.admit(b)])[0] for b in bodies]
    for settings in (dict(max_batch_size=1), GREEDY):
        engine = Engine(model, EngineConfig(**settings))
        with cuda_like_sdpa() as seen:
            got = engine.score(engine.admit_many(bodies))
        report = compare(expected, got)
        assert report["max_abs_diff"] <= 1e-5 and not report["decisions_changed"], (settings, report)
        assert seen.dead_rows == 0 and len(engine.prefix_cache) == 0


def test_op_time_measures_the_ops_outside_the_forward_and_only_them(loaded_model):
    """host_bench's split of host time: the ops' own compute outside the forward (a CPU doing the
    device's work) apart from the rest. A pass whose masks are large must show it; timing counts nothing."""
    engine = Engine(loaded_model("qwen3", "choice"), EngineConfig(**GREEDY))
    bodies = workloads.short(16, seed=3)
    engine.score(engine.admit_many(bodies))
    probe = Probe(engine)
    with probe.active(ops=False, op_time=True):
        wall = time.perf_counter()
        engine.score(engine.admit_many(bodies))
        wall = time.perf_counter() - wall
    c = probe.counts
    assert c.forwards == 1 and c.ops_outside == c.ops_inside == 0
    assert 0 < c.op_outside_s < wall - c.forward_s     # the rest of the host's time (admission, shaping) is apart
    untimed = Probe(engine)
    with untimed.active(ops=False):
        engine.score(engine.admit_many(bodies))
    assert untimed.counts.op_outside_s == 0
