"""The jevany-daemon benchmark: batching through a real daemon, against in-process references, plus parity.

    python benchmarks/bench.py                     # full CPU run
    python benchmarks/bench.py --quick             # fewer requests and rounds
    python benchmarks/bench.py --workloads choice_short choice_long same_state agent   # the prefix cache only
    python benchmarks/bench.py --device cuda --dtype bf16 --shape 0.8b --arch qwen3_5   # on a GPU host

Everything is compared within this one run (daemon vs in-process, batched vs
serial, packed vs rows) because absolute figures on a shared machine drift, by
tens of percent within a minute on the 2-core machine it was written on. So
both daemons (max_batch_size 1 and --batch) stay up side by side, and:

- concurrency 1 interleaves request by request: in-process, then each daemon,
  rotating who goes first; each p50 is over the same requests;
- at 32 clients, rounds of in-process serial, in-process ideal batches, then
  each daemon, on the same requests; a target's ratio is taken within each
  round, then the median over rounds.

The prefix cache's workloads (choice_short, choice_long, same_state, agent)
run on the default choice readout through three more daemons, cache on and
off: see prefix_cache_bench.py.

In-process means what a caller of the engine pays: validation, tokenization
and the forward pass. Clients are separate processes (benchmarks/loadgen.py)
that import jevany-client and never torch.

Writes JSON (and a PNG plot when matplotlib is installed) to --out-dir, and
prints a table plus the issue's targets with pass/fail.
"""
import argparse
import json
import os
import platform
import shlex
import statistics
import tempfile
from pathlib import Path

import torch

import prefix_cache_bench
from harness import HERE, ClientPool, Daemon, like_a_worker, worker_env_in_effect, median, percentile, timed
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model
from jevany_daemon.parity import compare


# --- models ---------------------------------------------------------------

class Models:
    """Builds each (arch, readout) model once per run, in a temporary directory."""

    def __init__(self, shape: str):
        self.shape = shape
        self.root = Path(tempfile.mkdtemp(prefix="jv-bench-"))
        self.dirs = {}

    def dir(self, arch: str, readout: str) -> Path:
        key = (arch, readout)
        if key not in self.dirs:
            self.dirs[key] = build_tiny_model(self.root / f"{arch}-{readout}", arch=arch, readout=readout,
                                              shape=self.shape)
        return self.dirs[key]


def engine(model, **settings) -> Engine:
    return Engine(model, EngineConfig(**settings))


# --- parity ---------------------------------------------------------------

PARITY_CASES = [("qwen3", "choice", "rows"), ("qwen3", "choice", "packed"), ("qwen3", "pointer", "rows"),
                ("qwen3", "pointer", "packed"), ("qwen3", "pointer", "shared"), ("qwen3", "lm_token", "packed"),
                ("qwen3_5", "choice", "rows"), ("qwen3_5", "pointer", "rows"), ("qwen3_5", "pointer", "shared")]


def parity_report(models: Models, args) -> list[dict]:
    bodies = workloads.mixed(args.parity_n, seed=7, max_words=30)
    rows = []
    for arch, readout, layout in PARITY_CASES:
        for dtype in ("fp32", "bf16"):
            model = load_model(str(models.dir(arch, readout)), device=args.device, dtype=dtype)
            e = engine(model, layout=layout, max_batch_size=16, max_padding_waste=1.0, batch_policy="greedy",
                       max_packed_tokens=1 << 16)
            serial = [e.score([e.admit(b)])[0] for b in bodies]
            batched = e.score([e.admit(b) for b in bodies])
            r = compare(serial, batched)
            rows.append({"arch": arch, "readout": readout, "layout": layout, "dtype": dtype,
                         "requests": len(bodies), "probabilities": r["probabilities"],
                         "max_abs_diff": r["max_abs_diff"], "mean_abs_diff": r["mean_abs_diff"],
                         "decisions_changed": len(r["decisions_changed"]),
                         "changed": [f"{i}:{q}" for i, q in r["decisions_changed"]]})
            del model, e
    return rows


# --- in-process references ------------------------------------------------

class InProcess:
    """The engine in this process, on the same requests: serially, and in ideal pre-formed batches.

    Two ideals: the whole set handed over at once, so the engine picks every
    batch from all of it (what an offline job gets), and `batch` requests at a
    time in arrival order (the most a server with that many clients can hold).
    """

    def __init__(self, model, batch: int, layout: str = "auto", **settings):
        self.batch = batch
        self.serial = engine(model, layout=layout, **settings)
        self.ideal = engine(model, layout=layout, max_batch_size=batch, batch_policy="greedy", **settings)

    def call(self, body: dict) -> dict:
        """One request as a caller of the engine pays for it: validation and tokenization too."""
        return self.serial.score([self.serial.admit(body)])[0]

    def serial_rps(self, bodies: list) -> float:
        _, t = timed(lambda: [self.call(b) for b in bodies])
        return len(bodies) / t

    def ideal_rps(self, bodies: list) -> float:
        _, t = timed(lambda: self.ideal.score([self.ideal.admit(b) for b in bodies]))
        return len(bodies) / t

    def online_rps(self, bodies: list) -> float:
        _, t = timed(lambda: [self.ideal.score([self.ideal.admit(b) for b in bodies[i: i + self.batch]])
                              for i in range(0, len(bodies), self.batch)])
        return len(bodies) / t


def summary(batch: int, concurrency: int, runs: list[dict], tokens: float) -> dict:
    """One cell of the sweep: the median of the rounds' throughputs, latencies pooled over the rounds."""
    latencies = [t for r in runs for t in r["latencies"]]
    rps = median([r["rps"] for r in runs])
    return {"max_batch_size": batch, "concurrency": concurrency, "rounds": len(runs),
            "rps": rps, "rps_rounds": [r["rps"] for r in runs], "tokens_per_s": rps * tokens,
            "p50_ms": percentile(latencies, 0.5) * 1000, "p95_ms": percentile(latencies, 0.95) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000,
            "mean_batch_size": median([r["mean_batch_size"] for r in runs]),
            "worker_busy": _median_known(runs, "busy"),
            **{key: _median_known(runs, key) for key in ("supervisor_cores", "worker_cores", "client_cores")}}


def _median_known(runs: list[dict], key: str) -> float | None:
    known = [r[key] for r in runs if r.get(key) is not None]
    return median(known) if known else None


# --- one workload -----------------------------------------------------------

IDLE_BLOCK = 16
MEASURED_SEED, WARM_SEED = 11, 7     # a workload's draws: the requests measured, the warm-up's own


def idle_latency(ref: InProcess, daemons: dict, bodies: list) -> dict:
    """Concurrency 1: blocks of up to IDLE_BLOCK requests, each block in-process and then through
    each daemon, rotating who goes first, so the machine's drift (large here) falls on all alike.
    Blocks rather than single requests: one process's torch threads spinning down after its
    pass must not land on another's next request; at least 16 blocks, so drift averages out."""
    size = max(1, min(IDLE_BLOCK, len(bodies) // 16))
    callers = [("inprocess", ref.call)] + [(b, lambda body, d=d: d.client.call("decide", body))
                                           for b, d in daemons.items()]
    latencies = {name: [] for name, _ in callers}
    for k, at in enumerate(range(0, len(bodies), size)):
        block = bodies[at: at + size]
        for name, call in callers[k % len(callers):] + callers[: k % len(callers)]:
            for body in block:
                _, t = timed(lambda: call(body))
                latencies[name].append(t)
    return latencies


def throughput_rounds(ref: InProcess, daemons: dict, pool: ClientPool, bodies: list, concurrency: int,
                      rounds: int) -> dict:
    """Rounds of: in-process serial and ideal, each daemon at `concurrency` client processes, and the
    batched daemon fed full batches by one pipelining client; all on the same requests.

    The targets take each ratio within a round, then the median over rounds:
    this machine's speed drifts by tens of percent within a minute. The
    pipelined figure is a diagnostic: the daemon's own cost once batches are
    full, without the client processes competing for the same cores.
    """
    out = {"serial": [], "ideal": [], "online": [], "pipelined": [], **{b: [] for b in daemons}}
    batched = daemons[max(daemons)]
    for _ in range(rounds):
        out["serial"].append(ref.serial_rps(bodies))
        out["ideal"].append(ref.ideal_rps(bodies))
        out["online"].append(ref.online_rps(bodies))
        for b, d in daemons.items():
            out[b].append(pool.run(d, bodies, concurrency))
        _, t = timed(lambda: [batched.client.decide_many(bodies[i: i + batched.batch])
                              for i in range(0, len(bodies), batched.batch)])
        out["pipelined"].append(len(bodies) / t)
    return out


def measure_workload(name: str, model, daemons: dict, args, pool: ClientPool | None, n: int) -> dict:
    bodies = workloads.WORKLOADS[name](n, seed=MEASURED_SEED)
    tokens = real_tokens(model, bodies)
    print(f"\n{name}: {len(bodies)} requests, {tokens:.0f} real tokens each on average", flush=True)
    ref = InProcess(model, args.batch)
    # Warm-up on requests of its own: warmed on the measured ones, a daemon would meet them at idle
    # with their prefixes kept (and on a GPU their shapes met), while the in-process engine had not.
    warm = workloads.WORKLOADS[name](min(n, 64), seed=WARM_SEED)
    for d in daemons.values():
        if pool is not None:     # warm-up, the adaptive policy's first measurements included
            pool.run(d, warm, 8)
        else:
            d.client.decide_many(warm[:2])
    ref.serial_rps(warm[:2])
    idle = idle_latency(ref, daemons, bodies)
    w = {"requests": len(bodies), "tokens_per_request": tokens,
         "inprocess": {"serial_p50_ms": percentile(idle["inprocess"], 0.5) * 1000}, "daemon": [],
         "ratios": {
             "idle_daemon_over_inprocess": percentile(idle[1], 0.5) / percentile(idle["inprocess"], 0.5),
             "idle_batching_on_over_off": percentile(idle[args.batch], 0.5) / percentile(idle[1], 0.5)},
         # the daemon's fixed cost: the same request through the daemon minus in-process, median
         "idle_overhead_ms": statistics.median(d - i for d, i in zip(idle[1], idle["inprocess"])) * 1000}
    for b in daemons:
        # concurrency 1 is the interleaved run: one request at a time, so batches of one
        w["daemon"].append(summary(b, 1, [{"rps": len(idle[b]) / sum(idle[b]), "latencies": idle[b],
                                           "mean_batch_size": 1.0}], tokens))
    if pool is not None:
        measure_throughput(w, name, model, bodies, tokens, ref, daemons, pool, args)
    w["daemon"].sort(key=lambda r: (r["max_batch_size"], r["concurrency"]))
    for r in w["daemon"]:
        print(f"  batch {r['max_batch_size']:>2} concurrency {r['concurrency']:>2}: {r['rps']:7.1f} req/s"
              f"  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  mean batch {r['mean_batch_size']:5.2f}"
              + ("" if r["worker_busy"] is None else f"  worker busy {r['worker_busy']:.0%}")
              + ("" if r["client_cores"] is None else
                 f"  CPU cores: supervisor {r['supervisor_cores']:.2f}, workers {r['worker_cores']:.2f},"
                 f" clients {r['client_cores']:.2f}"), flush=True)
    for k, v in w["ratios"].items():
        print(f"  {k}: {v:.3f}", flush=True)
    print(f"  idle overhead (same request, daemon minus in-process, median): {w['idle_overhead_ms']:.2f} ms",
          flush=True)
    return w


def measure_throughput(w: dict, name: str, model, bodies: list, tokens: float, ref: InProcess, daemons: dict,
                       pool: ClientPool, args) -> None:
    hot = throughput_rounds(ref, daemons, pool, bodies, 32, args.rounds)
    w["inprocess"].update({
        "serial_rps": median(hot["serial"]), "ideal_rps": median(hot["ideal"]),
        "online_ideal_rps": median(hot["online"]), "serial_rps_rounds": hot["serial"],
        "ideal_rps_rounds": hot["ideal"], "online_ideal_rps_rounds": hot["online"],
        "ideal_padding_waste": ref.ideal.stats.as_dict()["padding_waste"],
        "ideal_mean_batch_size": ref.ideal.stats.as_dict()["mean_batch_size"]})
    print(f"  in-process: serial {w['inprocess']['serial_rps']:.1f} req/s, ideal batches "
          f"{w['inprocess']['ideal_rps']:.1f} (whole set) and {w['inprocess']['online_ideal_rps']:.1f} "
          f"({args.batch} at a time, in arrival order)", flush=True)
    for b in daemons:
        w["daemon"].append(summary(b, 32, hot[b], tokens))
    batch = args.batch
    # each ratio within a round, then the median over rounds
    w["ratios"].update({
        "batched_over_serial_32": median([x["rps"] / y["rps"] for x, y in zip(hot[batch], hot[1])]),
        "daemon_over_ideal_32": median([x["rps"] / y for x, y in zip(hot[batch], hot["ideal"])]),
        "daemon_over_online_ideal_32": median([x["rps"] / y for x, y in zip(hot[batch], hot["online"])]),
        "pipelined_daemon_over_ideal": median([x / y for x, y in zip(hot["pipelined"], hot["ideal"])]),
    })
    w["pipelined_rps"] = median(hot["pipelined"])
    if name == "short":
        for c in (c for c in args.concurrencies if c not in (1, 32)):
            for b, d in daemons.items():
                w["daemon"].append(summary(b, c, [pool.run(d, bodies, c)], tokens))
    if name == "multi_question":
        # The layouts compared, each serving every request: with the prefix cache on (the default),
        # every request would go the cache's way, which runs a state once whatever the layout.
        once, rows = InProcess(model, batch, prefix_cache=0), InProcess(model, batch, layout="rows", prefix_cache=0)
        state_once = [once.ideal_rps(bodies) for _ in range(args.rounds)]
        plain = [rows.ideal_rps(bodies) for _ in range(args.rounds)]
        w["rows_inprocess"] = {"ideal_rps": median(plain), "ideal_rps_rounds": plain}
        w["ratios"]["state_once_over_rows"] = median([x / y for x, y in zip(state_once, plain)])
        print(f"  state once vs plain rows, ideal batches: {median(state_once):.1f} vs {median(plain):.1f} "
              f"req/s", flush=True)


# --- the run --------------------------------------------------------------

def real_tokens(model, bodies) -> float:
    e = engine(model)
    return sum(e.layout.real_tokens(e.admit(b).encoded) for b in bodies) / len(bodies)


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    models = Models(args.shape)
    quick = args.quick
    n = {"short": 96 if quick else 256, "long_uneven": 48 if quick else 96,
         "multi_question": 32 if quick else 64, "mixed": 48 if quick else 128}
    if args.requests:
        n = dict.fromkeys(n, args.requests)
    args.concurrencies = [1, 32] if quick else [1, 4, 16, 32, 64]
    args.rounds = 2 if quick else 3
    if args.parity_n is None:
        args.parity_n = 24 if quick else 64
    result = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "cpus": os.cpu_count(), "device": args.device, "dtype": args.dtype,
                          "shape": args.shape, "threads": args.threads, "quick": quick,
                          "serve_args": args.serve_args, "rounds": args.rounds, "worker_env": worker_env_in_effect()}}
    result["parity"] = []
    if not args.idle_only:
        print("parity (batched vs serial, per readout, layout and dtype)", flush=True)
        result["parity"] = parity_report(models, args)
    for row in result["parity"]:
        print(f"  {row['arch']:8} {row['readout']:8} {row['layout']:6} {row['dtype']}: max {row['max_abs_diff']:.2e}"
              f"  mean {row['mean_abs_diff']:.2e}  decisions changed {row['decisions_changed']}", flush=True)
    cache_names = [w for w in args.workloads if w in prefix_cache_bench.CACHE_WORKLOADS]
    if args.parity_only:
        if cache_names:
            result["prefix_cache"] = {"parity": prefix_cache_bench.cache_parity(models, PARITY_CASES, args)}
        return result

    model_dir = models.dir(args.arch, "pointer")
    model = load_model(str(model_dir), device=args.device, dtype=args.dtype)
    pool = None if args.idle_only else ClientPool(max(args.concurrencies))
    daemons = {}
    result["workloads"] = {}
    try:
        # both up side by side for the whole run, serving every workload in turn like a long-lived daemon
        names = [w for w in args.workloads if w in workloads.WORKLOADS]
        for b in (1, args.batch) if names else ():
            daemons[b] = Daemon(model_dir, args, b, args.policy)
        for name in names:
            result["workloads"][name] = measure_workload(name, model, daemons, args, pool, n[name])
        for d in list(daemons.values()):
            d.stop()
            daemons.pop(d.batch)
        if cache_names and pool is not None:
            result["prefix_cache"] = prefix_cache_bench.run(models, args, cache_names, pool, PARITY_CASES)
    finally:
        for d in daemons.values():
            d.stop()
        if pool is not None:
            pool.close()
    result["targets"] = targets(result)
    return result


def targets(result: dict) -> list[dict]:
    out = []
    ws = result["workloads"]

    def add(name, value, bound, ok):
        out.append({"target": name, "value": float(f"{value:.4g}"), "bound": bound, "met": bool(ok)})

    if "short" in ws:
        r = ws["short"]["ratios"]
        idle = r["idle_daemon_over_inprocess"]
        add("1a idle: daemon p50 / in-process p50 at concurrency 1", idle, "<= 1.05", idle <= 1.05)
        on_off = r["idle_batching_on_over_off"]
        add("1b idle: batching on / off p50 at concurrency 1", on_off, "<= 1.02", on_off <= 1.02)
    if "short" in ws and "batched_over_serial_32" in ws["short"]["ratios"]:
        r = ws["short"]["ratios"]
        short = r["batched_over_serial_32"]
        add("3 short, 32 clients: batched / serial throughput", short, ">= 1.3", short >= 1.3)
        ratio = r["daemon_over_ideal_32"]
        add("6 daemon at 32 clients / in-process ideal batches (short)", ratio, ">= 0.9", ratio >= 0.9)
    fp32 = [r for r in result["parity"] if r["dtype"] == "fp32"]
    if fp32:
        worst = max(r["max_abs_diff"] for r in fp32)
        changed = sum(r["decisions_changed"] for r in fp32)
        add("2 parity fp32: max probability difference", worst, "<= 1e-5", worst <= 1e-5)
        add("2 parity fp32: decisions changed", changed, "== 0", changed == 0)
    if "batched_over_serial_32" in ws.get("long_uneven", {}).get("ratios", {}):
        ratio = ws["long_uneven"]["ratios"]["batched_over_serial_32"]
        add("4 long uneven, 32 clients: batched / serial throughput", ratio, ">= 1.0", ratio >= 1.0)
    if "state_once_over_rows" in ws.get("multi_question", {}).get("ratios", {}):
        ratio = ws["multi_question"]["ratios"]["state_once_over_rows"]
        add("5 multi-question: state run once (packed or shared) / plain rows throughput", ratio, ">= 2.0",
            ratio >= 2.0)
    prefix_cache_bench.targets(result.get("prefix_cache", {}), add)
    return out


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    w = result["workloads"].get("short")
    if not w:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for batch in sorted({r["max_batch_size"] for r in w["daemon"]}):
        rows = [r for r in w["daemon"] if r["max_batch_size"] == batch]
        label = "serial (max_batch_size 1)" if batch == 1 else f"batched (max_batch_size {batch})"
        ax1.plot([r["concurrency"] for r in rows], [r["rps"] for r in rows], marker="o", label=label)
        ax2.plot([r["concurrency"] for r in rows], [r["p99_ms"] for r in rows], marker="o", label=label)
    ax1.axhline(w["inprocess"]["ideal_rps"], linestyle="--", color="gray", label="in-process ideal batches")
    ax1.set(xlabel="concurrent client processes", ylabel="requests / s", title="throughput (short workload)")
    ax2.set(xlabel="concurrent client processes", ylabel="ms", title="p99 latency (short workload)")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.legend()
        ax.grid(alpha=0.3)
    m = result["machine"]
    fig.suptitle(f"jevany-daemon, {m['shape']} model, {m['device']} {m['dtype']}, {m['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main() -> None:
    # no abbreviations: like_a_worker reads --glibc-malloc from the command line whole
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--quick", action="store_true", help="fewer requests and concurrencies (< 2 min)")
    p.add_argument("--parity-only", action="store_true", help="only the parity report (what CI runs)")
    p.add_argument("--idle-only", action="store_true", help="only concurrency 1 (targets 1a and 1b): no parity, "
                   "no client pool; for shapes too slow for the rest, e.g. --shape 0.8b --requests 32")
    p.add_argument("--requests", type=int, help="requests per workload [default: per workload and --quick]")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--shape", default="tiny", choices=("tiny", "0.8b"), help="0.8b: Qwen3.5-0.8B layer shape")
    p.add_argument("--arch", default="qwen3", choices=("qwen3", "qwen3_5"), help="model for the throughput runs")
    p.add_argument("--batch", type=int, default=32, help="max_batch_size of the batched runs")
    p.add_argument("--policy", default="adaptive", choices=("adaptive", "greedy"))
    every = [*workloads.WORKLOADS, *prefix_cache_bench.CACHE_WORKLOADS]
    p.add_argument("--workloads", nargs="+", default=every, choices=every,
                   help="the batching workloads (pointer readout) and the prefix cache's (choice readout)")
    p.add_argument("--cache-entries", type=int, default=64,
                   help="--prefix-cache of the cache-on daemons (the agent workload has 32 sessions)")
    p.add_argument("--parity-n", type=int, help="requests per parity case [default: 64, --quick 24]")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                   help="torch threads of the in-process references")
    p.add_argument("--serve-args", type=shlex.split, default=[],
                   help="more jevany-daemon serve flags for both daemons, e.g. '--cpu-threads 1'")
    p.add_argument("--glibc-malloc", action="store_true",
                   help="the in-process references under glibc's own malloc thresholds, not a worker's")
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    p.add_argument("--name", help="result file stem [default: DEVICE-DTYPE-SHAPE[-quick]]")
    args = p.parse_args()
    if args.idle_only and args.workloads == every:
        args.workloads = ["short"]
    result = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.name or (f"{args.device.split(':')[0]}-{args.dtype}-{args.shape}{'-quick' if args.quick else ''}"
                         f"{'-idle' if args.idle_only else ''}")
    (args.out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out_dir / (stem + '.json')}")
    if not (args.parity_only or args.idle_only) and plot(result, args.out_dir / f"{stem}.png"):
        print(f"wrote {args.out_dir / (stem + '.png')}")
    for t in result.get("targets", []):
        print(f"  [{'met' if t['met'] else 'NOT MET'}] {t['target']}: {t['value']} ({t['bound']})")


if __name__ == "__main__":
    like_a_worker()     # the in-process references run as a worker does, and leave no thread spinning
    main()
