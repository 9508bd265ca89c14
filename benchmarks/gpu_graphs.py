"""gpu-check's graphs phase: the shape plan's passes replayed as CUDA graphs, against passes as they come.

Per dtype, on the speed model (qwen3_5, choice, the default layout and
prefix cache), a plan of --batch requests a pass up to --graphs-max-tokens
padded tokens. Each case is written to the JSON as soon as it is measured,
so a run cut short keeps what it finished:

- warm: an engine with --cuda-graphs warms its plan: seconds per warm-up
  phase (first runs, capture), buckets captured, the MiB the graphs' pool
  took in all and for the largest captures, Triton autotuning benchmarks;
- parity: the same requests (short and mixed, one hand-over) through the
  graphs engine and an engine without a plan: max |dp|, decisions changed,
  non-finite probabilities of each;
- passes: passes of --batch requests and of one, graphs against no plan
  (gpu_busy.measure: wall ms, device busy ms, kernels and copies a pass,
  and Triton's autotuning benchmarks during these served passes, which
  with graphs must be none);
- throughput: hand-overs of 32, 64 and 128 short requests, in-process,
  graphs against no plan (requests/s, alternating, medians);
- delta_rule_on_torch (bf16 on CUDA, hybrid models): passes of --batch and
  of one with the delta rule on PyTorch's code instead of what serves it
  (fla's kernels where installed), captured too (a graphs engine of its
  own, warmed under the swap): the two compared once both are tuned;
- daemons (bf16 only, started with the run): a batched (--batch) and a
  serial daemon, both --cuda-graphs, 32 client processes closed-loop:
  requests/s each round from the first, and their ratio.

On the CPU (CI: --cpu --shape tiny) the same code runs with the plan's
runner making a plain call where CUDA would capture (replay.Plain), and
daemons with --shape-plan: nothing is judged there.
"""
import math
import statistics
import time

import torch

from gpu_busy import WARM_PASSES, autotuning_counted, delta_rule_on_torch, measure, print_case
from harness import median
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.warmup import warm_up
from jevany_daemon.model import kernels
from jevany_daemon.parity import compare

MIB = 1 << 20
HAND_OVERS = (32, 64, 128)      # requests handed over at once, for the throughput case
TOP_CAPTURES = 8                # the largest captures listed by bucket


def daemon_args(device: str, max_tokens: int) -> list[str]:
    """What the phase's daemons add to the speed phase's: graphs on a GPU, the plan alone on a CPU."""
    return ["--cuda-graphs" if device == "cuda" else "--shape-plan", "--max-packed-tokens", str(max_tokens)]


def engine(model, device: str, batch: int, max_tokens: int, graphs: bool) -> Engine:
    """Warmed as a worker warms: its paths, then (graphs) its plan."""
    runner = ({"cuda_graphs": True} if device == "cuda" else {"shape_plan": True}) if graphs else {}
    e = Engine(model, EngineConfig(max_batch_size=batch, max_packed_tokens=max_tokens, **runner))
    warm_up(e)
    return e


def graphs_phase(model, device: str, args, out: dict, save, label: str) -> None:
    """Fills out[case] case by case, calling save() after each."""
    workload = workloads.WORKLOADS[args.workload]
    graphs = engine(model, device, args.batch, args.graphs_max_tokens, graphs=True)
    before = torch.cuda.memory_reserved() if device == "cuda" else 0
    with autotuning_counted() as tunings:
        started = time.monotonic()
        phases = graphs.warm_plan()
        warm_s = time.monotonic() - started
    replay = graphs.replay
    largest = sorted(replay.capture_bytes.items(), key=lambda kv: -kv[1])[:TOP_CAPTURES]
    out["warm"] = {"buckets": len(replay.plan), "captured": replay.describe()["captured"], "seconds": round(warm_s, 1),
                   "phases_s": phases, "pool_mib": round(((torch.cuda.memory_reserved() if device == "cuda" else 0)
                                                          - before) / MIB, 1),
                   "largest_captures_mib": {str(b): round(n / MIB, 1) for b, n in largest},
                   "autotune_benchmarks": None if tunings is None else sum(tunings.values())}
    print(f"  {label} graphs warm: {out['warm']}")
    save()
    eager = engine(model, device, args.batch, args.graphs_max_tokens, graphs=False)
    out["parity"] = parity(eager, graphs, workload, args)
    print(f"  {label} graphs parity: {out['parity']}")
    save()
    out["passes"] = {}
    for name, e in (("graphs", graphs), ("as_they_come", eager)):
        out["passes"][name] = passes(e, workload, args, device, f"{label} {name},")
        save()
    out["throughput"] = throughput(graphs, eager, args)
    print(f"  {label} graphs throughput: {out['throughput']}")
    out["plan_counts"] = graphs.plan_stats()
    save()
    if device == "cuda" and model.dtype == torch.bfloat16 and kernels.modeling_module(model.causal_lm) is not None:
        del graphs
        with delta_rule_on_torch(model.causal_lm):
            on_torch = engine(model, device, args.batch, args.graphs_max_tokens, graphs=True)
            on_torch.warm_plan()
            out["delta_rule_on_torch"] = passes(on_torch, workload, args, device, f"{label} graphs, delta rule on torch,")
        save()


def parity(eager: Engine, graphs: Engine, workload, args) -> dict:
    # Mixed requests of a size every plan here holds (two questions of 20 words: within 512 padded tokens)
    bodies = workload(args.parity_n, seed=71) + workloads.mixed(args.parity_n, seed=72, max_words=20,
                                                                 max_questions=2)
    want = eager.score(eager.admit_many(bodies))
    got = graphs.score(graphs.admit_many(bodies))
    report = compare(want, got)
    return {"requests": len(bodies), "max_abs_diff": report["max_abs_diff"],
            "decisions_changed": len(report["decisions_changed"]),
            "non_finite": {"graphs": _non_finite(got), "as_they_come": _non_finite(want)},
            "errors": sum(not isinstance(o, dict) for o in got), "plan": graphs.plan_stats()}


def _non_finite(outcomes: list) -> int:
    return sum(not math.isfinite(p) for o in outcomes if isinstance(o, dict)
               for answer in o["answers"].values() for p in _probabilities(answer))


def _probabilities(answer: dict) -> list[float]:
    values = answer.get("probabilities") or {}
    return list(values.values()) if isinstance(values, dict) else list(values)


def passes(e: Engine, workload, args, device: str, label: str) -> dict:
    seeds = iter(range(81, 1000))
    out = {}
    for case, size, count in (("batched", args.batch, args.busy_passes), ("single", 1, 4 * args.busy_passes)):
        draws = [workload((WARM_PASSES + count) * size, seed=next(seeds)) for _ in range(2)]
        timed, profiled = ([d[i * size:(i + 1) * size] for i in range(WARM_PASSES + count)] for d in draws)
        out[case] = measure(e, timed, profiled[WARM_PASSES:], device)
        print_case(label, out[case])
    return out


def throughput(graphs: Engine, eager: Engine, args) -> dict:
    out = {}
    for n in HAND_OVERS:
        times = {"graphs": [], "as_they_come": []}
        for k in range(args.rounds + 1):
            bodies = workloads.short(n, seed=90 + k)
            for name, e in (("graphs", graphs), ("as_they_come", eager))[::1 if k % 2 else -1]:
                admitted = e.admit_many(bodies)
                started = time.perf_counter()
                e.score(admitted)
                if k:                               # the first round meets new words: not timed
                    times[name].append(time.perf_counter() - started)
        out[n] = {name: round(n / statistics.median(t), 1) for name, t in times.items()}
        out[n]["graphs_over_as_they_come"] = round(out[n]["graphs"] / out[n]["as_they_come"], 3)
    return out


def daemon_rounds(daemons: dict, pool, bodies: list, clients: int, rounds: int) -> dict:
    """The batched and serial graphs daemons, alternating who goes first; every round kept, the first too."""
    runs = {name: [] for name in daemons}
    order = list(daemons)
    for k in range(rounds):
        for name in order[k % 2:] + order[:k % 2]:
            run = pool.run(daemons[name], bodies, clients)
            runs[name].append(round(run["rps"], 1))
    batched, serial = order
    return {"rps_rounds": runs, "batched_over_serial": median([b / s for b, s in zip(runs[batched], runs[serial])]),
            "plan": {name: d.client.status()["plan"] for name, d in daemons.items()}}

