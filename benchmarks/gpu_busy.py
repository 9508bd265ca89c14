"""How busy the device is while the engine serves passes in-process: gpu-check's busy phase.

A pass is kept waiting by the host (admission, launching each kernel, shaping answers) or by the
device (its kernels). The CPU proxies in host_bench.py count what the host does; this reads the
device's side on a real GPU: torch's profiler lists every kernel and copy the passes ran, their
union on the device's timeline is the busy time, and the same passes run again without the
profiler give the wall time it is set against (the profiler's own host cost would otherwise make
the device look idler than it is).

Two cases per dtype: passes of `batch` requests (what a loaded daemon serves) and passes of one
(what an idle daemon serves, where launches rather than arithmetic set the latency). Each runs
three times: as served; with cuDNN's attention kernel let back in (torch's own choice for bf16,
which the engine turns off: model/kernels.py); and with the linear-attention layers' delta rule
on transformers' PyTorch code instead of flash-linear-attention's Triton kernels.

The timed passes also count Triton's autotuning benchmarks, by kernel. fla keys the tuning of
its chunked cumulative sum on the number of rows, so a pass with a row count no earlier pass had
tunes again (four configs, each timed by Triton's benchmark loop): on an H200 (2026-12-04) the
first variant run, whichever it was, met most of the new row counts and paid for them. Compare
variants on passes of one (no new row counts after the first) or where the counts are equal,
or meet every row count first (tune_rows, gpu-check's --busy-tune-rows): the timed passes record
the row counts their delta rule saw, so the sweep can be sized to them.

On the CPU there is no device timeline: busy and device ops are None, and the wall time and the
host's costliest ops are measured, so CI runs the code without judging anything.
"""
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from unittest import mock

import torch
from torch.nn.attention import sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from jevany_daemon.engine.probe import Probe
from jevany_daemon.model import kernels
from sdpa_probe import EVERY_KERNEL

TUNING_WIDTH = 64    # positions a row in the sweep: one chunk of fla's (and the reference's)
WARM_PASSES = 2     # new shapes compile Triton kernels and grow the allocator: not measured
TOP_OPS = 15        # host and device ops listed, by time
NAME_CHARS = 100    # of a kernel's name (C++ templates run to thousands)


def union_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals: the time at least one kernel ran."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def top(timed: list[tuple[str, float]], passes: int, keep: int = TOP_OPS) -> dict:
    """The names that took the most time: {name: {"ms": per pass, "calls": per pass}}, most first."""
    ms, calls = Counter(), Counter()
    for name, us in timed:
        ms[name] += us / 1000 / passes
        calls[name] += 1 / passes
    return {name[:NAME_CHARS]: {"ms": round(t, 3), "calls": round(calls[name], 2)} for name, t in ms.most_common(keep)}


def _run(engine, passes: list[list]) -> None:
    for bodies in passes:
        engine.score([engine.admit(b) for b in bodies])


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@contextmanager
def autotuning_counted():
    """A Counter of Triton's autotuning benchmarks by kernel name while inside (one entry per config
    timed), or None where Triton is not installed (CPU builds of torch)."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        yield None
        return
    counts, bench = Counter(), Autotuner._bench

    def counted(self, *args, **kwargs):
        fn = getattr(self, "base_fn", None) or getattr(self, "fn", None)
        counts[getattr(fn, "__name__", "?")] += 1
        return bench(self, *args, **kwargs)

    with mock.patch.object(Autotuner, "_bench", counted):
        yield counts


@contextmanager
def _prefill_rule_wrapped(causal_lm, wrap):
    """For a while, the prefill delta rule replaced by wrap(what serves it); nothing without such layers."""
    module = kernels.modeling_module(causal_lm)
    served = getattr(module, kernels.PREFILL_RULE, None) if module is not None else None
    if served is None:
        yield
        return
    setattr(module, kernels.PREFILL_RULE, wrap(served))
    try:
        yield
    finally:
        setattr(module, kernels.PREFILL_RULE, served)


@contextmanager
def rows_seen(causal_lm):
    """A set of the row counts the prefill delta rule is called with while inside (empty without such layers)."""
    seen = set()

    def counting(rule):
        def counted(query, *args, **kwargs):
            seen.add(query.shape[0])
            return rule(query, *args, **kwargs)
        return counted

    with _prefill_rule_wrapped(causal_lm, counting):
        yield seen


def tune_rows(model, rows: int, device: str) -> dict | None:
    """Call the served prefill delta rule once for every row count from 1 to rows, as the model's layers
    call it, so that whatever it tunes per row count is tuned before a pass is timed; None without such
    layers. {"rows", "seconds", "autotune_benchmarks"}: what meeting them all cost."""
    module = kernels.modeling_module(model.causal_lm)
    if module is None:
        return None
    layer = next(m.linear_attn for m in model.causal_lm.modules() if getattr(m, "linear_attn", None) is not None)
    rule, dtype = getattr(module, kernels.PREFILL_RULE), model.dtype
    generator = torch.Generator().manual_seed(0)

    def random(*shape, to=dtype):
        return torch.randn(shape, generator=generator).to(device=device, dtype=to)

    with autotuning_counted() as tunings, torch.no_grad():
        started = time.perf_counter()
        for b in range(1, rows + 1):
            qk = (b, TUNING_WIDTH, layer.num_k_heads, layer.head_k_dim)
            heads = (b, TUNING_WIDTH, layer.num_v_heads)
            rule(random(*qk), random(*qk), random(*heads, layer.head_v_dim),
                 g=-random(*heads, to=torch.float32).abs(), beta=random(*heads).sigmoid(), initial_state=None,
                 output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=None)
        _sync(device)
        seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": seconds,
            "autotune_benchmarks": None if tunings is None else sum(tunings.values())}


def measure(engine, passes: list[list], profiled: list[list], device: str) -> dict:
    """Wall ms per pass of passes[WARM_PASSES:], unprofiled; from a profiled run of `profiled`, as
    many passes of the same sizes: the host ops that took the most of the host's time, and on
    CUDA the device's busy ms, its ops (kernels and copies) and those that took the most of it.
    The names say where a pass goes: an attention op whose host time dwarfs its kernel's (cuDNN
    building a plan), a flood of small kernels (launches), a copy no one meant."""
    _run(engine, passes[:WARM_PASSES])
    measured = passes[WARM_PASSES:]
    _sync(device)
    # forwards counted, nothing else (ops=False dispatches nothing through Python): a pass of
    # misses on a hybrid model runs its kept states first, a second forward
    with Probe(engine).active(ops=False) as probe, autotuning_counted() as tunings, \
            rows_seen(engine.model.causal_lm) as rows:
        started = time.perf_counter()
        _run(engine, measured)
        _sync(device)
        wall_ms = (time.perf_counter() - started) * 1000 / len(measured)
    out = {"passes": len(measured), "requests_per_pass": len(measured[0]), "wall_ms": wall_ms,
           "forwards_per_pass": probe.counts.forwards / len(measured),
           "autotune_benchmarks_per_pass": None if tunings is None else sum(tunings.values()) / len(measured),
           "autotuned_kernels": None if tunings is None else dict(tunings.most_common()),
           "delta_rule_rows": sorted(rows),
           "busy_ms": None, "busy_fraction": None, "device_ops_per_pass": None}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        _run(engine, profiled)
        _sync(device)
    events, n = prof.events(), len(profiled)
    host = [(e.name, e.self_cpu_time_total) for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    out["top_host_ops"] = top(host, n)
    if device != "cuda":
        return out
    on_device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_ms = union_us([(e.time_range.start, e.time_range.end) for e in on_device]) / 1000 / n
    out.update(busy_ms=busy_ms, busy_fraction=busy_ms / wall_ms, device_ops_per_pass=len(on_device) / n,
               top_device_ops=top([(e.name, e.time_range.elapsed_us()) for e in on_device], n))
    return out


def delta_rule_on_torch(causal_lm):
    """The prefill delta rule on transformers' PyTorch code for a while, whatever serves it."""
    def on_torch(served):
        reference = kernels.reference_call(served)

        def call(*args, **kwargs):
            if kwargs.get("cu_seqlens") is not None:      # rows packed end to end: the reference would mix them
                raise ValueError("packed sequences need the served kernel; this variant cannot run them")
            return reference(*args, **kwargs)
        return call

    return _prefill_rule_wrapped(causal_lm, on_torch)


def variants(model) -> dict:
    """The busy phase's runs: as served; every attention kernel, cuDNN's too; the delta rule on torch."""
    return {"as_served": nullcontext, "with_cudnn_attention": lambda: sdpa_kernel(EVERY_KERNEL),
            "delta_rule_on_torch": lambda: delta_rule_on_torch(model.causal_lm)}


def busy_phase(ref, model, workload, batch: int, device: str, out: dict, label: str, passes: int = 6) -> None:
    """Fills out[variant][case] and prints it as each is measured, so a run cut short keeps and
    shows what it finished.

    ref: bench.InProcess of `model` (its ideal engine takes `batch` a pass, its serial engine one);
    workload(n, seed): n request bodies. Every run gets requests of its own draw: the same
    requests again would find their prefixes cached by an earlier run, a lighter pass."""
    seeds = iter(range(13, 1000))
    for variant, kernels_of in variants(model).items():
        out[variant] = {}
        for case, engine, size, count in (("batched", ref.ideal, batch, passes),
                                          ("single", ref.serial, 1, 4 * passes)):
            draws = [workload((WARM_PASSES + count) * size, seed=next(seeds)) for _ in range(2)]
            timed_passes, profiled_passes = ([d[i * size:(i + 1) * size] for i in range(WARM_PASSES + count)]
                                             for d in draws)
            with kernels_of():
                r = out[variant][case] = measure(engine, timed_passes, profiled_passes[WARM_PASSES:], device)
            print_case(f"{label} busy, {variant},", r)


def print_case(prefix: str, r: dict) -> None:
    line = (f"  {prefix} {r['requests_per_pass']:>2} a pass: {r['wall_ms']:8.2f} ms a pass, "
            f"{r['forwards_per_pass']:.1f} forwards")
    if r["autotune_benchmarks_per_pass"]:
        line += f", {r['autotune_benchmarks_per_pass']:.1f} autotuning benchmarks"
    if r["busy_ms"] is not None:
        line += (f", device busy {r['busy_ms']:.2f} ms ({r['busy_fraction']:.0%}), "
                 f"{r['device_ops_per_pass']:.0f} kernels and copies a pass")
    print(line)
