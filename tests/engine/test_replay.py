"""Passes in the shape plan's buckets: the same answers, fixed buffers, no host read inside, warmed before ready.

Everything a CUDA graph capture needs is checked here on the CPU; the capture
itself runs in gpu-check's graphs phase (scripts/gpu-check).
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine import replay as replay_module
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.fixed_forward import FixedForward
from jevany_daemon.engine.probe import SCALAR_READS
from jevany_daemon.engine.replay import Plain
from jevany_daemon.engine.shape_plan import Bucket, PlanTooLarge
from jevany_daemon.engine.warmup import warm_up
from jevany_daemon.parity import compare

from .cuda_like import cuda_like_sdpa

# A small plan: rows to 16, passes to 512 padded tokens (a few dozen buckets, warmed in seconds).
SMALL = dict(max_batch_size=4, max_packed_tokens=512, batch_policy="greedy", max_padding_waste=1.0)


def planned(model, **settings) -> Engine:
    engine = Engine(model, EngineConfig(**{**SMALL, "shape_plan": True, **settings}))
    warm_up(engine)
    engine.warm_plan()
    return engine


def as_served(model, **settings) -> Engine:
    engine = Engine(model, EngineConfig(**{**SMALL, **settings}))
    warm_up(engine)
    return engine


def bodies(n=24, seed=5):
    return workloads.short(n // 2, seed=seed) + workloads.mixed(n // 2, seed=seed + 1, max_words=20, max_questions=2)


def one_question(requests):
    return [{**b, "questions": dict(list(b["questions"].items())[:1])} for b in requests]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("readout", ["choice", "pointer", "lm_token"])
def test_planned_passes_answer_as_passes_run_as_they_come(loaded_model, arch, readout):
    model = loaded_model(arch, readout)
    expected = as_served(model)
    engine = planned(model)
    requests = bodies()
    report = compare(expected.score(expected.admit_many(requests)), engine.score(engine.admit_many(requests)))
    assert report["max_abs_diff"] <= 1e-5 and not report["decisions_changed"], report
    counts = engine.plan_stats()
    assert counts["planned"] == engine.stats.batches and counts["eager"] == {}, counts
    assert engine.stats.batches >= 6


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_without_a_prefix_cache_the_plan_continues_nothing(loaded_model, arch):
    model = loaded_model(arch, "choice")
    expected, engine = as_served(model, prefix_cache=0), planned(model, prefix_cache=0)
    assert engine.replay.plan.cached == 0 and planned(model).replay.plan.cached > 0
    single = one_question(workloads.short(12, seed=8))
    report = compare(expected.score(expected.admit_many(single)), engine.score(engine.admit_many(single)))
    assert report["max_abs_diff"] <= 1e-5 and not report["decisions_changed"]
    assert engine.plan_stats()["planned"] == engine.stats.batches
    if arch == "qwen3_5":
        # A hybrid model without a cache runs several questions as a prefix pass, then its branches: two
        # forwards, outside the plan.
        engine.score(engine.admit_many(workloads.mixed(2, seed=9, min_words=20)))
        assert engine.plan_stats()["eager"].get("layout", 0) >= 1


def test_padded_rows_and_columns_never_make_a_keyless_query(loaded_model):
    # On CUDA a query with no key to attend to is NaN; padding a pass to its bucket adds such candidates.
    for arch in ("qwen3", "qwen3_5"):
        engine = planned(loaded_model(arch, "choice"))
        with cuda_like_sdpa() as seen:
            outcomes = engine.score(engine.admit_many(bodies(12, seed=11)))
        assert seen.calls and seen.dead_rows == 0
        assert all(isinstance(o, dict) for o in outcomes)


def test_every_bucket_is_warmed_before_ready_and_no_served_pass_builds_one(loaded_model, monkeypatch):
    engine = planned(loaded_model("qwen3_5", "choice"))
    replay = engine.replay
    assert set(replay.slots) == set(replay.plan.buckets) == set(replay.calls)
    assert replay.warm_up_s["first_runs"] > 0
    built = []
    monkeypatch.setattr(FixedForward, "__init__", lambda *a, **k: built.append(a))
    engine.score(engine.admit_many(bodies(24, seed=12)))
    assert built == [] and engine.plan_stats()["planned"] >= 4


def test_a_buckets_buffers_keep_their_addresses_whatever_the_prefix_cache_does(loaded_model):
    model = loaded_model("qwen3_5", "choice")
    engine, expected = planned(model), as_served(model)
    replay = engine.replay
    addresses = {b: s.buffer.data_ptr() for b, s in replay.slots.items()}
    head = replay.head
    head_addresses = [t.data_ptr() for t in (head.conv, head.recurrent)]
    engine.score(engine.admit_many(bodies(12, seed=13)))
    engine.forget([a for a in engine.admit_many(workloads.short(1, seed=14))])   # drops the pinned head
    assert engine.live_head() is None
    requests = bodies(12, seed=15)
    got = engine.score(engine.admit_many(requests))                               # pins it again
    assert engine.live_head() is not None and engine.plan_stats()["planned"] >= 4
    assert {b: s.buffer.data_ptr() for b, s in replay.slots.items()} == addresses
    assert replay.head is head and [t.data_ptr() for t in (head.conv, head.recurrent)] == head_addresses
    # The buckets kept their own copy of the head; what continues it answers as the head pinned anew.
    report = compare(expected.score(expected.admit_many(requests)), got)
    assert report["max_abs_diff"] <= 1e-5 and not report["decisions_changed"]


# Ops that read a device value into Python (a sync on CUDA, a graph break in torch.compile, impossible
# in a captured graph), ops whose output's shape depends on values, and tensors made from Python data
# (torch.tensor: a copy from the host on CUDA, which a capture cannot hold).
DATA_DEPENDENT = {"aten.nonzero.default", "aten.masked_select.default", "aten._unique2.default",
                  "aten.unique_dim.default", "aten.unique_consecutive.default", "aten.repeat_interleave.Tensor",
                  "aten.bincount.default", "aten.lift_fresh.default", "aten.lift_fresh_copy.default"}


class NoHostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in SCALAR_READS or name in DATA_DEPENDENT:
            raise AssertionError(f"{name} inside a planned forward")
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_the_check_catches_a_host_read():
    with pytest.raises(AssertionError, match="_local_scalar_dense"):
        with NoHostReads():
            torch.ones(2).sum().item()
    with pytest.raises(AssertionError, match="nonzero"):
        with NoHostReads():
            torch.ones(2).nonzero()
    with pytest.raises(AssertionError, match="lift_fresh"):
        with NoHostReads():
            torch.tensor([1, 2]) + 1


SMALL_BODY = {"state": "parcel two weeks late", "questions": {"q": {"type": "choice", "criteria": {"refund": None,
                                                                                                    "resend": None}}}}


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_no_host_read_nor_data_dependent_op_inside_a_planned_forward_at_real_depth(deep_model, arch, eager_compile):
    # The real models' depth (28 and 24 layers), through each kind of readout (label, pointer).
    for readout in ("choice", "pointer"):
        engine = planned(deep_model(arch, readout), max_batch_size=1, max_packed_tokens=160)
        with NoHostReads() as mode:
            for bucket in (Bucket(1, 128), Bucket(2, 64)):
                engine.replay.slots[bucket].forward()
        assert mode.ops > 100
        # And a served pass's whole path before its download reads nothing either.
        admitted = engine.admit_many([SMALL_BODY])
        with NoHostReads():
            launched = engine.launch(admitted)
        assert launched.fixed and launched.error is None
        assert all(isinstance(o, dict) for o in engine.collect(launched))
    # The same forward compiles whole: a graph break would raise here (fullgraph).
    slot = engine.replay.slots[Bucket(2, 64)]
    with torch.inference_mode():
        compiled = torch.compile(slot.forward, fullgraph=True, dynamic=False, backend="eager")()
        assert torch.equal(compiled, slot.forward())


def test_a_pass_outside_the_plan_runs_as_it_comes_and_is_counted(loaded_model):
    engine = planned(loaded_model("qwen3", "choice"), prefix_min_tokens=150)
    long_state = {**workloads.short(1, seed=17)[0], "state": " ".join(["refund", "late"] * 30)}
    outcome = engine.score(engine.admit_many([long_state]))       # a state to keep: its pass returns its cache
    assert isinstance(outcome[0], dict)
    assert engine.plan_stats()["eager"] == {"layout": 1}
    engine.score(engine.admit_many([long_state]))                 # a hit on it: not the head
    assert engine.plan_stats()["eager"] == {"layout": 2} and engine.prefix_cache.hits == 1
    # On a hybrid model every question is a row: three of a 60-word state are 3 x 256 padded, past 512.
    engine = planned(loaded_model("qwen3_5", "choice"))
    body = workloads.request(__import__("random").Random(18), 60, 3, structured=False)
    [outcome] = engine.score(engine.admit_many([body]))
    assert isinstance(outcome, dict) and engine.plan_stats()["eager"] == {"shape": 1}


def test_more_readout_positions_than_a_bucket_gathers_run_as_they_come(loaded_model, monkeypatch):
    from jevany_daemon.engine import fixed_forward

    # Buckets sized for a readout position every 64 tokens: a question of 12 options reads 13 in ~80.
    monkeypatch.setitem(fixed_forward.TOKENS_PER_READOUT, "pointer", 64)
    model = loaded_model("qwen3", "pointer")
    engine, expected = planned(model), as_served(model)
    body = {"state": "s", "questions": {"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(12)}}}}
    [outcome] = engine.score(engine.admit_many([body]))
    [want] = expected.score(expected.admit_many([body]))
    assert engine.plan_stats()["eager"] == {"readouts": 1}
    assert compare([want], [outcome])["max_abs_diff"] <= 1e-5
    # A yes/no question (3 positions) on a state of 60 words (over 128 tokens wide: 3 gathered a row) fits.
    engine.score(engine.admit_many([{"state": " ".join(workloads.WORDS[:60]), "questions": {"q": {"type": "noul"}}}]))
    assert engine.plan_stats()["planned"] == 1


def test_a_blended_readout_runs_as_it_comes(tiny_model):
    from jevany_daemon.model.loading import load_model

    model = load_model(str(tiny_model("qwen3", "pointer")), readout="choice")    # choice, with a native readout
    engine, expected = planned(model, choice_native_weight=0.3), as_served(model, choice_native_weight=0.3)
    requests = workloads.short(4, seed=21)
    report = compare(expected.score(expected.admit_many(requests)), engine.score(engine.admit_many(requests)))
    assert report["max_abs_diff"] <= 1e-5
    assert engine.plan_stats()["eager"] == {"blend": engine.stats.batches} and engine.stats.batches >= 1


def test_warming_a_plan_past_its_limit_stops_the_start_and_says_what_to_change(loaded_model):
    engine = Engine(loaded_model("qwen3", "choice"), EngineConfig(**SMALL, shape_plan=True, warmup_limit=0.001))
    warm_up(engine)
    with pytest.raises(PlanTooLarge, match="--warmup-limit.*--max-packed-tokens"):
        engine.warm_plan()
    assert engine.replay is None           # passes still run as they come


def test_planned_passes_on_the_simulated_accelerator(loaded_model):
    model = loaded_model("qwen3", "choice")
    engine = Engine(model, EngineConfig(**SMALL, shape_plan=True), simulated_pass_ms=1.0)
    warm_up(engine)
    engine.warm_plan()
    expected = as_served(model)
    requests = bodies(12, seed=24)
    report = compare(expected.score(expected.admit_many(requests)), engine.score(engine.admit_many(requests)))
    assert report["max_abs_diff"] <= 1e-5 and engine.plan_stats()["planned"] == engine.stats.batches >= 3


def test_the_warm_up_estimate_follows_tokens_when_running_and_buckets_when_compiling(loaded_model):
    import time

    from jevany_daemon.engine.replay import Replay
    from jevany_daemon.engine.shape_plan import ShapePlan

    plan = ShapePlan(max_rows=32, max_width=2048, max_tokens=2048)
    # Buckets go largest first: 3 of 100 done in 100 s, holding 30% of the tokens. Running ones cost
    # about their tokens (333 s in all); compiled ones about the same each (3,333 s).
    for runner, over in (("eager", False), ("graphs", False), ("compiled", True)):
        replay = Replay(plan, runner, None, None, torch.float32, torch.device("cpu"), 0)
        check = lambda: replay._check_time(time.monotonic() - 100, 600, 3, 100, 300, 1000)   # noqa: E731
        if over:
            with pytest.raises(PlanTooLarge, match="about 3333 s"):
                check()
        else:
            check()
    with pytest.raises(PlanTooLarge, match="about 333 s"):      # past its limit, whatever the estimate
        Replay(plan, "eager", None, None, torch.float32, torch.device("cpu"), 0)._check_time(
            time.monotonic() - 100, 300, 3, 100, 300, 1000)


def test_graphs_on_a_cpu_replay_a_plain_call_of_every_bucket(loaded_model):
    model = loaded_model("qwen3", "choice")
    engine = planned(model, shape_plan=False, cuda_graphs=True)
    assert engine.replay.runner == "graphs"
    assert all(isinstance(call, Plain) for call in engine.replay.calls.values())
    assert engine.replay.describe()["captured"] == 0
    expected = as_served(model)
    requests = bodies(12, seed=19)
    report = compare(expected.score(expected.admit_many(requests)), engine.score(engine.admit_many(requests)))
    assert report["max_abs_diff"] <= 1e-5 and engine.plan_stats()["planned"] == engine.stats.batches


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile with dynamo's eager backend: the same tracing, graph breaks and guards, no codegen;
    the linear-attention functions a compiled engine puts behind custom ops restored afterwards."""
    import torch._dynamo
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from jevany_daemon.model.kernels import CONVOLUTIONS, PREFILL_RULE

    for name in (PREFILL_RULE, *CONVOLUTIONS):
        monkeypatch.setattr(modeling_qwen3_5, name, getattr(modeling_qwen3_5, name))
    monkeypatch.setattr(replay_module, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_passes_answer_the_same_and_never_compile_once_warm(loaded_model, eager_compile):
    import random

    import torch._dynamo.utils

    model = loaded_model("qwen3_5", "choice")
    small = dict(max_batch_size=1, max_packed_tokens=160)
    engine = planned(model, shape_plan=False, compile="default", **small)
    assert engine.replay.warm_up_s["compile"] > 0 and len(engine.replay.calls) == len(engine.replay.plan) >= 8
    from transformers.models.qwen3_5 import modeling_qwen3_5       # traced through custom ops, not into them
    assert modeling_qwen3_5.torch_chunk_gated_delta_rule.behind and modeling_qwen3_5.causal_conv1d_fn.behind
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    expected = as_served(model, **small)
    rng = random.Random(23)         # short states and questions of varied lengths: several widths of the plan
    words = lambda n: " ".join(rng.choice(workloads.WORDS) for _ in range(n))      # noqa: E731
    requests = [{"state": words(rng.randint(1, 8)), "questions": {"q": {"type": "noul",
                                                                         "instructions": words(rng.randint(1, 4))}}}
                for _ in range(24)]
    report = compare(expected.score(expected.admit_many(requests)), engine.score(engine.admit_many(requests)))
    assert report["max_abs_diff"] <= 1e-5 and not report["decisions_changed"]
    counts = engine.plan_stats()
    assert counts["recompiles"] == 0 and counts["planned"] == engine.stats.batches == 24, counts
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_a_served_pass_that_would_compile_again_runs_eagerly_and_is_counted(loaded_model, eager_compile):
    engine = planned(loaded_model("qwen3", "choice"), shape_plan=False, compile="default", max_batch_size=1,
                     max_packed_tokens=64)
    bucket = next(iter(engine.replay.slots))
    slot = engine.replay.slots[bucket]
    slot.buffer = torch.cat([slot.buffer, slot.buffer[:16]])     # what the compiled graph was not made for
    with torch.inference_mode():
        out = engine.replay.calls[bucket].replay()
    assert engine.plan_stats()["recompiles"] == 1 and torch.isfinite(out).all()
