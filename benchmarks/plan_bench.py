"""The shape plan on a CPU: its spacing, what falls outside it, what a pass costs around it, compiling it.

    python benchmarks/plan_bench.py                       # every phase (about 25 minutes on 2 cores)
    python benchmarks/plan_bench.py --phases spacing fallbacks

Phases (each writes its part of the JSON as soon as it is measured):

- spacing: pass shapes recorded from passes run as they come (short and
  mixed workloads, batches of 8 and 32, qwen3 and qwen3_5 at the tiny
  width), then for candidate spacings of the rows and widths ladders (steps
  per octave) the plan's buckets at --max-packed-tokens 8192 and the real /
  computed tokens were those passes padded to it. What shape_plan.py's
  spacing was chosen by.
- fallbacks: an engine with the plan at the default settings but
  --max-batch-size 32: rounds of 64 requests handed over at once (as a
  worker gets them) of the mixed workload (1-4 questions, 5-60 words: every
  request within the limits), then of the short one. Passes run as they
  came, by why, real / computed tokens, requests a pass and requests/s,
  with the plan and without; under the CPU's padding cap (0.1, the
  default here) and the GPU's (0.5, where a plan is meant to serve).
- host: one pass of 32 short requests at the real models' depth (qwen3 28
  layers, qwen3_5 24, tiny width): torch ops outside what a CUDA graph
  would replay (the planned call) against ops outside the decoder's
  forward without a plan, and forwards, uploads, syncs per pass.
- lone: right after ready, lone requests of lengths not met before: p50
  and p99 of the time a pass takes, with the plan and without (tiny width).
- compile: the buckets the short workload's passes use (32 and 1 request),
  compiled with inductor: seconds each compile took, ms a pass compiled
  and eager (alternating, medians), the largest probability difference;
  then, on a small plan at the real depth (compiled by dynamo with its
  eager backend: the same graphs, guards and recompiles, no code
  generated), 500 passes of random requests: graph breaks (fullgraph
  would have failed the warm-up) and recompiles while serving.

Writes benchmarks/results/cpu-plan.json (--out).
"""
import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness import like_a_worker, machine, percentile, write_result
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine import pass_inputs
from jevany_daemon.engine import replay as replay_module
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.probe import Probe
from jevany_daemon.engine.shape_plan import ShapePlan
from jevany_daemon.engine.warmup import warm_up
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model
from jevany_daemon.parity import compare

HERE = Path(__file__).resolve().parent
ARCHS = ("qwen3", "qwen3_5")
PHASES = ("spacing", "fallbacks", "host", "lone", "compile")
SPACINGS = [(1, 2), (2, 2), (2, 4), (4, 4), (4, 8)]      # (rows, widths) steps per octave


class Models:
    def __init__(self, root: Path):
        self.root, self.cache = root, {}

    def __call__(self, arch: str, shape: str = "tiny"):
        if (arch, shape) not in self.cache:
            path = build_tiny_model(self.root / f"{arch}-{shape}", arch=arch, readout="choice", shape=shape)
            self.cache[arch, shape] = load_model(str(path), device="cpu")
        return self.cache[arch, shape]


def engine_for(model, plan: bool, only=None, **settings) -> Engine:
    engine = Engine(model, EngineConfig(**settings, shape_plan=plan))
    warm_up(engine)
    if plan:
        engine.warm_plan(only)
    return engine


def buckets_of(model, settings: dict, batches: list[list[dict]]) -> set:
    """The buckets the plan would run these batches in, each as one pass: found by laying them out as a
    planned engine would (packed rows filled to the plan's choice of width), without warming anything."""
    from jevany_daemon.engine.shape_plan import ShapePlan

    engine = engine_for(model, False, **settings)
    head = engine.live_head()
    plan = ShapePlan.for_engine(engine.config.max_batch_size, engine.config.max_packed_tokens,
                                engine.model.context_window, head.width if head is not None else 0)
    for layout in (engine.layout, engine._reuse):
        if layout is not None and hasattr(layout, "row_width"):
            layout.row_width = plan.packing_width
    return {plan.fit(*_shape_of(engine, engine.admit_many(bodies))) for bodies in batches} - {None}


def one_pass(engine: Engine, bodies: list[dict]) -> list:
    """These requests as one pass, whatever the batch limits and the plan's prices would make of them."""
    return engine.collect(engine.launch(engine.admit_many(bodies)))


def handed_over(engine: Engine, bodies: list[dict], per: int = 64) -> None:
    for i in range(0, len(bodies), per):
        outcomes = engine.score(engine.admit_many(bodies[i:i + per]))
        failed = [o for o in outcomes if not isinstance(o, dict)]
        if failed:
            raise SystemExit(f"a request failed: {failed[0]}")


def real_share(engine: Engine) -> float:
    return round(engine.stats.real_tokens / max(1, engine.stats.padded_tokens), 3)


# --- spacing -----------------------------------------------------------------------

def spacing(models: Models, args) -> dict:
    shapes, register = [], pass_inputs.Grid.register

    def recorded(grid, upload):
        shapes.append((len(grid.rows), grid.width, sum(len(ids) for ids, _, _ in grid.rows)))
        return register(grid, upload)

    recorded_passes = {}
    pass_inputs.Grid.register = recorded
    try:
        for arch in ARCHS:
            for name, make in (("short", workloads.short), ("mixed", workloads.mixed)):
                for size in (8, 32):
                    engine = engine_for(models(arch), False, max_batch_size=size, batch_policy="greedy",
                                        max_padding_waste=0.5)
                    shapes.clear()
                    handed_over(engine, make(args.requests, seed=7))
                    recorded_passes[f"{arch}/{name}/{size}"] = list(shapes)
    finally:
        pass_inputs.Grid.register = register
    out = {}
    for row_steps, width_steps in SPACINGS:
        plan = ShapePlan(128, 4096, 8192, row_steps=row_steps, width_steps=width_steps)
        key = f"rows/{row_steps} widths/{width_steps}"
        out[key] = {"buckets": len(plan.buckets)}
        for case, passes in recorded_passes.items():
            real = sum(r for _, _, r in passes)
            computed = sum(plan.tokens(n, w) if plan.fit(n, w) else n * w for n, w, _ in passes)
            out[key][case] = round(real / computed, 3)
        print(f"spacing {key:22} {out[key]['buckets']:4} buckets  " +
              "  ".join(f"{c} {v}" for c, v in out[key].items() if c != "buckets"))
    out["as_they_come"] = {case: round(sum(r for *_, r in p) / sum(n * w for n, w, _ in p), 3)
                           for case, p in recorded_passes.items()}
    print("spacing as they come            " + "  ".join(f"{c} {v}" for c, v in out["as_they_come"].items()))
    return out


# --- fallbacks -----------------------------------------------------------------------

def fallbacks(models: Models, args) -> dict:
    out = {}
    for arch in ARCHS:
        out[arch] = {}
        for cap_name, cap in (("cpu_cap", None), ("gpu_cap", 0.5)):
            settings = dict(max_batch_size=32, max_padding_waste=cap)
            started = time.monotonic()
            planned = engine_for(models(arch), True, **settings)
            row = {"buckets": len(planned.replay.plan), "warm_up_s": round(time.monotonic() - started, 1),
                   "phases_s": planned.replay.warm_up_s}
            plain = engine_for(models(arch), False, **settings)
            for name, make in (("mixed", workloads.mixed), ("short", workloads.short)):
                rps = {}
                for label, engine in (("planned", planned), ("without_plan", plain)):
                    engine.reset_statistics()
                    began = time.perf_counter()
                    handed_over(engine, make(args.requests * 2, seed=11))
                    rps[label] = round(args.requests * 2 / (time.perf_counter() - began), 1)
                counts = planned.plan_stats()
                eager = sum(counts["eager"].values())
                row[name] = {"passes": planned.stats.batches, "eager": counts["eager"],
                             "eager_share": round(eager / max(1, planned.stats.batches), 4),
                             "real_per_computed": real_share(planned), "without_plan": real_share(plain),
                             "mean_batch": round(planned.stats.requests / max(1, planned.stats.batches), 2),
                             "mean_batch_without_plan": round(plain.stats.requests / max(1, plain.stats.batches), 2),
                             "rps": rps}
                print(f"fallbacks {arch:8} {cap_name} {name:6} {row[name]}")
            out[arch][cap_name] = row
    return out


# --- host -----------------------------------------------------------------------------

def host(models: Models, args) -> dict:
    out = {}
    for arch in ARCHS:
        model = models(arch, "deep")
        settings = dict(max_batch_size=32)
        passes = [workloads.short(32, seed=5), workloads.short(32, seed=6)]
        only = buckets_of(model, settings, passes)   # at the real depth: the plan's buckets these take, not 234
        row = {}
        for name, engine in (("planned", engine_for(model, True, only, **settings)),
                             ("as_they_come", engine_for(model, False, **settings))):
            probe = Probe(engine)
            one_pass(engine, passes[0])                 # unmeasured: the words met
            before = engine.stream.counters()
            with probe.active():
                done = engine.stats.batches
                one_pass(engine, passes[1])
            after = engine.stream.counters()
            c = probe.counts
            row[name] = {"passes": engine.stats.batches - done, "forwards": c.forwards,
                         "ops_outside": c.ops_outside, "ops_inside": c.ops_inside, "scalar_reads": c.scalar_reads,
                         "uploads": after["uploads"] - before["uploads"],
                         "downloads": after["downloads"] - before["downloads"],
                         "top_ops_outside": dict(c.outside_by_op.most_common(8))}
            if name == "planned":
                row[name]["planned"] = engine.plan_stats()
            print(f"host {arch:8} {name:12} {row[name]}")
        out[arch] = row
    return out


# --- lone ------------------------------------------------------------------------------

def lone(models: Models, args) -> dict:
    out = {}
    for arch in ARCHS:
        row = {}
        for name, plan in (("planned", True), ("as_they_come", False)):
            engine = engine_for(models(arch), plan, max_batch_size=32)
            rng = random.Random(13)
            seconds = []
            for i in range(args.lone):
                body = workloads.request(rng, rng.randint(3, 120), rng.randint(1, 3), structured=False)
                started = time.perf_counter()
                engine.score(engine.admit_many([body]))
                seconds.append(time.perf_counter() - started)
            p50, p99 = statistics.median(seconds), percentile(seconds, 0.99)
            row[name] = {"requests": len(seconds), "p50_ms": round(p50 * 1000, 1), "p99_ms": round(p99 * 1000, 1),
                         "p99_per_p50": round(p99 / p50, 2)}
            if plan:
                row[name]["eager"] = engine.plan_stats()["eager"]
            print(f"lone {arch:8} {name:12} {row[name]}")
        out[arch] = row
    return out


# --- compile -----------------------------------------------------------------------------

def compile_phase(models: Models, args) -> dict:
    out = {"inductor": {}, "recompiles": {}}
    for arch in ARCHS:
        model = models(arch)
        only = buckets_of(model, dict(max_batch_size=32), [workloads.short(32, seed=17), workloads.short(1, seed=17)])
        eager = engine_for(model, True, only, max_batch_size=32)
        rows = []
        for bucket in sorted(only):
            slot = eager.replay.slots[bucket]
            started = time.perf_counter()
            with torch.inference_mode():
                compiled = torch.compile(slot.forward, fullgraph=True, dynamic=False)
                compiled()
                compile_s = time.perf_counter() - started
                times = {"eager": [], "compiled": []}
                for _ in range(args.compile_rounds):
                    for name, call in (("eager", slot.forward), ("compiled", compiled)):
                        began = time.perf_counter()
                        result = call()
                        times[name].append(time.perf_counter() - began)
                diff = (compiled() - slot.forward()).abs().max().item()
            e, c = statistics.median(times["eager"]) * 1000, statistics.median(times["compiled"]) * 1000
            rows.append({"bucket": str(bucket), "compile_s": round(compile_s, 1), "eager_ms": round(e, 2),
                         "compiled_ms": round(c, 2), "speedup": round(e / c, 3), "max_abs_diff": diff,
                         "finite": bool(torch.isfinite(result).all())})
            print(f"compile {arch:8} {rows[-1]}")
        out["inductor"][arch] = rows
        out["recompiles"][arch] = recompiles(models(arch, "deep"), args)
    return out


def _shape_of(engine: Engine, batch) -> tuple[int, int]:
    from jevany_daemon.engine.pass_inputs import Upload

    job = engine.layout_for(batch[0]).prepare([a.encoded for a in batch], engine.pad_id, Upload(),
                                              engine.passes.backbone)
    single = job.single()
    return single.sent.n, single.sent.width


def recompiles(model, args) -> dict:
    import torch._dynamo
    import torch._dynamo.utils

    replay_module.COMPILE_BACKEND = "eager"
    torch._dynamo.reset()
    small = dict(max_batch_size=2, max_packed_tokens=256, batch_policy="greedy", max_padding_waste=1.0)
    started = time.monotonic()
    engine = Engine(model, EngineConfig(**small, compile="default"))
    warm_up(engine)
    engine.warm_plan()                     # fullgraph: a graph break raises here
    warm_s = time.monotonic() - started
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    rng = random.Random(19)
    words = lambda n: " ".join(rng.choice(workloads.WORDS) for _ in range(n))      # noqa: E731
    for _ in range(args.random_passes):
        bodies = [{"state": words(rng.randint(1, 30)),
                   "questions": {"q": {"type": rng.choice(["noul", "choice"]), "instructions": words(rng.randint(1, 6)),
                                       **({"criteria": {w: None for w in rng.sample(workloads.WORDS, 3)}}
                                          if rng.random() < 0.5 else {})}}}
                  for _ in range(rng.randint(1, 2))]
        admitted = [a for a in engine.admit_many(bodies) if not hasattr(a, "code")]
        if admitted:
            engine.score(admitted)
    counts = engine.plan_stats()
    out = {"buckets": len(engine.replay.plan), "warm_up_s": round(warm_s, 1), "passes": engine.stats.batches,
           "planned": counts["planned"], "eager": counts["eager"], "recompiles": counts["recompiles"],
           "graphs_compiled_while_serving": torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs,
           "fullgraph": True}       # every bucket compiled whole: a graph break would have failed the warm-up
    print(f"recompiles {model.model_type:12} {out}")
    replay_module.COMPILE_BACKEND = "inductor"
    torch._dynamo.reset()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--requests", type=int, default=512, help="requests a workload of the spacing and "
                        "fallbacks phases holds (fallbacks: twice that)")
    parser.add_argument("--lone", type=int, default=200, help="lone requests of the lone phase")
    parser.add_argument("--compile-rounds", type=int, default=7)
    parser.add_argument("--random-passes", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--glibc-malloc", action="store_true", help="glibc's own malloc thresholds")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "cpu-plan.json")
    parser.add_argument("--fresh", action="store_true", help="start the JSON anew (else the phases run replace "
                        "theirs in it and the others stay)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = {} if args.fresh or not args.out.exists() else json.loads(args.out.read_text())
    result.setdefault("machine", {})
    phases = {"spacing": spacing, "fallbacks": fallbacks, "host": host, "lone": lone, "compile": compile_phase}
    with tempfile.TemporaryDirectory(prefix="jv-plan-") as tmp:
        models = Models(Path(tmp))
        for phase in args.phases:
            result["machine"][phase] = machine(torch=torch.__version__, threads=args.threads)   # its load, too
            result[phase] = phases[phase](models, args)
            write_result(result, args.out)         # a cut run keeps what it measured
    return 0


if __name__ == "__main__":
    like_a_worker()
    sys.exit(main())
