"""Failed passes: non-finite output, out-of-memory, and a device that is gone for good."""
import gc
import math
import traceback
import weakref

import pytest
import torch

from jevany_client.errors import InternalError
from jevany_daemon import workloads
from jevany_daemon.engine.faults import DeviceLost, detached, is_device_lost, is_out_of_memory

REQUESTS = workloads.mixed(6, seed=3, max_words=12)


def _engine(make_engine):
    # packed, no prefix cache: one row per request, so a decoder call's batch size is the number of requests
    return make_engine("qwen3", "choice", layout="packed", max_batch_size=len(REQUESTS), max_padding_waste=1.0,
                       batch_policy="greedy", max_packed_tokens=1 << 16, prefix_cache=0)


def _inject(engine, fault):
    """Run fault(inputs, hidden) on every decoder call: it may raise, or return altered hidden states."""
    real = engine.passes.backbone
    calls = []

    def backbone(**inputs):
        calls.append(inputs["input_ids"].shape[0])
        return fault(inputs, real(**inputs))

    engine.passes.backbone = backbone
    return calls


def _finite(outcomes) -> bool:
    return all(math.isfinite(p) for r in outcomes if isinstance(r, dict)
               for a in r["answers"].values() for p in a["probabilities"].values())


def _halvings(n: int) -> int:
    """Requests retried when every pass of more than one fails: n, then each half's."""
    return 0 if n == 1 else n + _halvings(n // 2) + _halvings(n - n // 2)


def test_a_non_finite_batch_is_rescored_alone(make_engine):
    engine = _engine(make_engine)
    expected = [engine.score([engine.admit(b)])[0] for b in REQUESTS]

    def nan_when_batched(inputs, hidden):
        return hidden * float("nan") if inputs["input_ids"].shape[0] > 1 else hidden

    _inject(engine, nan_when_batched)
    results = engine.score([engine.admit(b) for b in REQUESTS])
    assert all(isinstance(r, dict) and r["batch"]["size"] == 1 for r in results)
    assert [r["answers"] for r in results] == [r["answers"] for r in expected]
    # every pass of more than one fails: halved down to one, each level of halves retried in turn
    assert engine.stats.retried == _halvings(len(REQUESTS))


def test_a_request_still_non_finite_alone_gets_internal(make_engine):
    engine = _engine(make_engine)
    _inject(engine, lambda inputs, hidden: hidden.masked_fill(torch.ones_like(hidden, dtype=torch.bool), math.inf))
    results = engine.score([engine.admit(b) for b in REQUESTS])
    assert all(isinstance(r, InternalError) for r in results)
    assert all("non-finite" in r.message for r in results)
    assert engine.stats.non_finite == 2 * len(REQUESTS) - 1      # every pass of the halving, down to each alone


def test_out_of_memory_rescores_alone_and_empties_the_cache(make_engine, monkeypatch):
    engine = _engine(make_engine)
    expected = [engine.score([engine.admit(b)])[0] for b in REQUESTS]
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))

    def oom_when_batched(inputs, hidden):
        if inputs["input_ids"].shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return hidden

    _inject(engine, oom_when_batched)
    results = engine.score([engine.admit(b) for b in REQUESTS])
    assert [r["answers"] for r in results] == [r["answers"] for r in expected]
    assert emptied and engine.lost is None
    # the worker keeps serving
    assert isinstance(engine.score([engine.admit(REQUESTS[0])])[0], dict)


@pytest.mark.parametrize("error", [
    torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("CUDA error: device-side assert triggered"),
    RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, ...)`"),
])
def test_a_poisoned_device_ends_scoring_for_good(make_engine, error):
    engine = _engine(make_engine)

    def poisoned(inputs, hidden):
        raise error

    calls = _inject(engine, poisoned)
    with pytest.raises(DeviceLost, match="cannot run passes any more"):
        engine.score([engine.admit(b) for b in REQUESTS])
    assert calls == [len(REQUESTS)]                  # no request was blamed and retried alone
    with pytest.raises(DeviceLost):
        engine.score([engine.admit(REQUESTS[0])])
    assert calls == [len(REQUESTS)]                  # and nothing runs on that device again


def test_in_process_callers_see_the_lost_device(make_engine):
    engine = _engine(make_engine)

    def poisoned(inputs, hidden):
        raise torch.AcceleratorError("CUDA error: unspecified launch failure")

    _inject(engine, poisoned)
    with pytest.raises(DeviceLost):
        engine.decide(REQUESTS[0])
    with pytest.raises(DeviceLost):
        engine.decide(REQUESTS[1])


@pytest.mark.parametrize("error,lost,oom", [
    (torch.OutOfMemoryError("CUDA out of memory."), False, True),
    (RuntimeError("CUDA error: out of memory"), False, True),
    (torch.AcceleratorError("CUDA error: misaligned address"), True, False),
    (RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"), True, False),
    (ValueError("CUDA error in a caller's text"), False, False),
    (RuntimeError("shape mismatch"), False, False),
])
def test_which_errors_end_a_worker(error, lost, oom):
    assert is_device_lost(error) is lost
    assert is_out_of_memory(error) is oom


def test_one_device_to_host_copy_per_pass(make_engine, monkeypatch):
    """A .tolist() per question would stall a GPU once per question: a pass copies to the host once."""
    engine = make_engine("qwen3", "pointer", layout="packed", max_batch_size=len(REQUESTS), max_padding_waste=1.0,
                         batch_policy="greedy", max_packed_tokens=1 << 16)
    admitted = [engine.admit(b) for b in REQUESTS]
    copies = []
    for name in ("tolist", "item", "cpu", "numpy"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            copies.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    results = engine.score(admitted)
    questions = sum(len(r["answers"]) for r in results)
    assert engine.stats.batches == 1 and questions > 1
    assert copies == ["tolist"]
    assert _finite(results)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_failed_pass_frees_what_it_computed_before_its_requests_are_retried(make_engine, monkeypatch, arch):
    """The retries after an out-of-memory pass fit only if the failed pass's memory is gone by then:
    its joined cache (kept entries' rows and the states computed so far) and its activations. A kept
    exception's traceback holds the frames they live in, and a worker's full collections are rare."""
    engine = make_engine(arch, "choice", batch_policy="greedy", max_batch_size=32, max_padding_waste=1.0,
                         prefix_min_tokens=200)
    engine.score(engine.admit_many(workloads.short(2, seed=1)))          # pins the head: the next pass joins it
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    layers = engine.model.backbone.layers
    last, original = layers[len(layers) - 1], layers[len(layers) - 1].forward
    failed, alive_at_retries = [], []

    def forward(hidden_states, *args, **kwargs):
        if failed:
            alive_at_retries.append(sum(ref() is not None for ref in failed))
        elif hidden_states.shape[0] > 1:
            cache = kwargs["cache"]
            failed.extend([weakref.ref(hidden_states), weakref.ref(cache)] + [weakref.ref(l) for l in cache.layers])
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(hidden_states, *args, **kwargs)

    monkeypatch.setattr(last, "forward", forward)
    gc.collect()
    gc.disable()
    try:
        outcomes = engine.score(engine.admit_many(workloads.short(4, seed=2)))
        alive_after = sum(ref() is not None for ref in failed)
        left_for_the_collector = gc.collect()      # a cycle through the kept error and its frames
    finally:
        gc.enable()
    assert all(isinstance(o, dict) and o["batch"]["size"] == 2 for o in outcomes), outcomes   # in halves
    # every retry's forwards (two requests each, and the head pinned again: the failed pass forgot it)
    assert failed and len(alive_at_retries) >= 2
    assert set(alive_at_retries) == {0} and alive_after == 0, (alive_at_retries, alive_after)
    assert left_for_the_collector == 0


def test_a_kept_error_still_says_where_it_was_raised_but_holds_no_frame():
    def inner(held):
        raise OSError("the cause")

    def outer():
        held = torch.ones(4)
        try:
            inner(held)
        except OSError as cause:
            raise RuntimeError("the failure") from cause

    try:
        outer()
    except RuntimeError as exc:
        kept = detached(exc)
    assert kept.__traceback__ is None and kept.__cause__.__traceback__ is None
    assert str(kept) == "the failure"                                  # what a request's error says
    [note] = kept.__notes__
    assert "in outer" in note and "in inner" not in note
    [note] = kept.__cause__.__notes__
    assert "in outer" in note and "in inner" in note and "raise OSError" in note
    assert detached(kept) is kept and len(kept.__notes__) == 1         # kept twice, noted once
