"""The jevany-daemon benchmark: batching through a real daemon, against in-process references, plus parity.

    python benchmarks/bench.py                     # full CPU run (< 10 min on 2 cores)
    python benchmarks/bench.py --quick             # < 2 min
    python benchmarks/bench.py --device cuda --dtype bf16 --shape 0.8b --arch qwen3_5   # on a GPU host

Everything is compared within this one run (daemon vs in-process, batched vs
serial, packed vs rows) because absolute figures on a shared machine drift.
Writes JSON (and a PNG plot when matplotlib is installed) to --out-dir, and
prints a table plus the issue's targets with pass/fail.
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from jevany_client import JevClient, JevTimeoutError
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model
from jevany_daemon.parity import compare

HERE = Path(__file__).resolve().parent


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


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


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

def inprocess(model, bodies: list, batch: int, layout: str = "auto") -> dict:
    """Serial, and ideal pre-formed batches (everything handed over at once), on the same requests."""
    serial_e = engine(model, layout=layout)
    ideal_e = engine(model, layout=layout, max_batch_size=batch, batch_policy="greedy")
    adm_s = [serial_e.admit(b) for b in bodies]
    adm_i = [ideal_e.admit(b) for b in bodies]
    serial_e.score(adm_s[:2])      # warm-up
    _, t_serial = timed(lambda: [serial_e.score([a]) for a in adm_s])
    _, t_ideal = timed(lambda: ideal_e.score(adm_i))
    latencies = []
    for a in adm_s[: min(32, len(adm_s))]:
        _, t = timed(lambda: serial_e.score([a]))
        latencies.append(t)
    return {"serial_rps": len(bodies) / t_serial, "ideal_rps": len(bodies) / t_ideal,
            "serial_p50_ms": percentile(latencies, 0.5) * 1000,
            "ideal_padding_waste": ideal_e.stats.as_dict()["padding_waste"],
            "ideal_mean_batch_size": ideal_e.stats.as_dict()["mean_batch_size"]}


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


# --- the daemon -----------------------------------------------------------

class Daemon:
    def __init__(self, model_dir: Path, args, batch: int, policy: str):
        self.dir = Path(tempfile.mkdtemp(prefix="jv-bd-"))
        self.endpoint = f"ipc://{self.dir}/d.sock"
        env = {**os.environ, "JEVANY_BATCH_POLICY": policy, "JEVANY_LOG_LEVEL": "WARNING"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jevany_daemon", "serve", "--model", str(model_dir), "--bind", self.endpoint,
             "--control", "", "--max-batch-size", str(batch), "--device", args.device, "--dtype", args.dtype,
             "--max-queue", "4096"], env=env)
        deadline = time.monotonic() + 600
        with JevClient(self.endpoint, timeout=1) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError("daemon exited during start-up")
                try:
                    if c.status()["state"] == "ready":
                        return
                except JevTimeoutError:
                    continue
                time.sleep(0.2)    # loading; poll again
        raise RuntimeError("daemon not ready")

    def status(self) -> dict:
        with JevClient(self.endpoint, timeout=30) as c:
            return c.status()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


def client_worker(conn) -> None:
    """A long-lived client process: run whatever slice of requests the driver sends, on 'go'."""
    conn.send("started")
    while True:
        task = conn.recv()
        if task is None:
            return
        endpoint, bodies = task
        with JevClient(endpoint, timeout=600) as client:
            client.ping()                    # connected before the clock starts
            conn.send("ready")
            conn.recv()                      # go
            latencies = []
            for body in bodies:
                started = time.perf_counter()
                client.call("decide", body)
                latencies.append(time.perf_counter() - started)
        conn.send(latencies)


class ClientPool:
    def __init__(self, n: int):
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for _ in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=client_worker, args=(child,), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:     # all interpreters up before anything is timed
            assert c.recv() == "started"

    def run(self, endpoint: str, bodies: list, concurrency: int) -> dict:
        conns = self.conns[:concurrency]
        for k, c in enumerate(conns):
            c.send((endpoint, bodies[k::concurrency]))
        for c in conns:
            assert c.recv() == "ready"
        started = time.perf_counter()
        for c in conns:
            c.send("go")
        latencies = [t for c in conns for t in c.recv()]
        elapsed = time.perf_counter() - started
        return {"rps": len(bodies) / elapsed, "p50_ms": percentile(latencies, 0.5) * 1000,
                "p95_ms": percentile(latencies, 0.95) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000}

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(10)


def daemon_sweep(model_dir, bodies, tokens, args, pool, concurrencies, batches) -> list[dict]:
    rows = []
    for batch in batches:
        d = Daemon(model_dir, args, batch, args.policy)
        try:
            pool.run(d.endpoint, bodies[:8], 1)     # warm-up
            for c in concurrencies:
                before = d.status()["batching"]
                r = pool.run(d.endpoint, bodies, c)
                after = d.status()["batching"]
                passes = after["batches"] - before["batches"]
                r.update({"max_batch_size": batch, "concurrency": c, "tokens_per_s": r["rps"] * tokens,
                          "mean_batch_size": (after["requests"] - before["requests"]) / max(1, passes)})
                rows.append(r)
                print(f"  batch {batch:>2} concurrency {c:>2}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms"
                      f"  p99 {r['p99_ms']:7.1f} ms  mean batch {r['mean_batch_size']:.2f}", flush=True)
            models = JevClient(d.endpoint, timeout=30)
            rows[-1]["padding_waste"] = models.models()["models"][0]["batching"].get("padding_waste")
            models.close()
        finally:
            d.stop()
    return rows


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
    conc = [1, 32] if quick else [1, 4, 16, 32, 64]
    batches = [1, args.batch]
    result = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "cpus": os.cpu_count(), "device": args.device, "dtype": args.dtype,
                          "shape": args.shape, "threads": args.threads, "quick": quick}}
    print("parity (batched vs serial, per readout, layout and dtype)", flush=True)
    result["parity"] = parity_report(models, args)
    for row in result["parity"]:
        print(f"  {row['arch']:8} {row['readout']:8} {row['layout']:6} {row['dtype']}: max {row['max_abs_diff']:.2e}"
              f"  mean {row['mean_abs_diff']:.2e}  decisions changed {row['decisions_changed']}", flush=True)
    if args.parity_only:
        return result

    model_dir = models.dir(args.arch, "pointer")
    model = load_model(str(model_dir), device=args.device, dtype=args.dtype)
    pool = ClientPool(max(conc))
    result["workloads"] = {}
    try:
        for name in args.workloads:
            bodies = workloads.WORKLOADS[name](n[name], seed=11)
            tokens = real_tokens(model, bodies)
            print(f"\n{name}: {len(bodies)} requests, {tokens:.0f} real tokens each on average", flush=True)
            ref = inprocess(model, bodies, args.batch)
            print(f"  in-process serial {ref['serial_rps']:.1f} req/s, ideal batches {ref['ideal_rps']:.1f} req/s",
                  flush=True)
            w = {"requests": len(bodies), "tokens_per_request": tokens, "inprocess": ref,
                 "daemon": daemon_sweep(model_dir, bodies, tokens, args, pool,
                                        conc if name == "short" else [1, 32], batches)}
            if name == "multi_question":
                w["rows_inprocess"] = inprocess(model, bodies, args.batch, layout="rows")
                print(f"  plain rows: serial {w['rows_inprocess']['serial_rps']:.1f} req/s, ideal batches "
                      f"{w['rows_inprocess']['ideal_rps']:.1f} req/s", flush=True)
            result["workloads"][name] = w
    finally:
        pool.close()
    result["targets"] = targets(result, args.batch)
    return result


def cell(w: dict, batch: int, concurrency: int) -> dict:
    return next(r for r in w["daemon"] if r["max_batch_size"] == batch and r["concurrency"] == concurrency)


def targets(result: dict, batch: int) -> list[dict]:
    out = []
    ws = result["workloads"]

    def add(name, value, bound, ok):
        out.append({"target": name, "value": float(f"{value:.4g}"), "bound": bound, "met": bool(ok)})

    if "short" in ws:
        s = ws["short"]
        idle = cell(s, 1, 1)["p50_ms"] / s["inprocess"]["serial_p50_ms"]
        add("1a idle: daemon p50 / in-process p50 at concurrency 1", idle, "<= 1.05", idle <= 1.05)
        on_off = cell(s, batch, 1)["p50_ms"] / cell(s, 1, 1)["p50_ms"]
        add("1b idle: batching on / off p50 at concurrency 1", on_off, "<= 1.02", on_off <= 1.02)
        short = cell(s, batch, 32)["rps"] / cell(s, 1, 32)["rps"]
        add("3 short, 32 clients: batched / serial throughput", short, ">= 1.3", short >= 1.3)
        ratio = cell(s, batch, 32)["rps"] / s["inprocess"]["ideal_rps"]
        add("6 daemon at 32 clients / in-process ideal batches (short)", ratio, ">= 0.9", ratio >= 0.9)
    fp32 = [r for r in result["parity"] if r["dtype"] == "fp32"]
    worst = max(r["max_abs_diff"] for r in fp32)
    changed = sum(r["decisions_changed"] for r in fp32)
    add("2 parity fp32: max probability difference", worst, "<= 1e-5", worst <= 1e-5)
    add("2 parity fp32: decisions changed", changed, "== 0", changed == 0)
    if "long_uneven" in ws:
        lu = ws["long_uneven"]
        ratio = cell(lu, batch, 32)["rps"] / cell(lu, 1, 32)["rps"]
        add("4 long uneven, 32 clients: batched / serial throughput", ratio, ">= 1.0", ratio >= 1.0)
    if "multi_question" in ws and "rows_inprocess" in ws["multi_question"]:
        m = ws["multi_question"]
        ratio = m["inprocess"]["ideal_rps"] / m["rows_inprocess"]["ideal_rps"]
        add("5 multi-question: state run once (packed or shared) / plain rows throughput", ratio, ">= 2.0",
            ratio >= 2.0)
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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer requests and concurrencies (< 2 min)")
    p.add_argument("--parity-only", action="store_true", help="only the parity report (what CI runs)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--shape", default="tiny", choices=("tiny", "0.8b"), help="0.8b: Qwen3.5-0.8B layer shape")
    p.add_argument("--arch", default="qwen3", choices=("qwen3", "qwen3_5"), help="model for the throughput runs")
    p.add_argument("--batch", type=int, default=32, help="max_batch_size of the batched runs")
    p.add_argument("--policy", default="adaptive", choices=("adaptive", "greedy"))
    p.add_argument("--workloads", nargs="+", default=list(workloads.WORKLOADS), choices=list(workloads.WORKLOADS))
    p.add_argument("--parity-n", type=int, default=64)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    p.add_argument("--name", help="result file stem [default: DEVICE-DTYPE-SHAPE[-quick]]")
    args = p.parse_args()
    result = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"{args.device.split(':')[0]}-{args.dtype}-{args.shape}{'-quick' if args.quick else ''}"
    (args.out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out_dir / (stem + '.json')}")
    if not args.parity_only and plot(result, args.out_dir / f"{stem}.png"):
        print(f"wrote {args.out_dir / (stem + '.png')}")
    for t in result.get("targets", []):
        print(f"  [{'met' if t['met'] else 'NOT MET'}] {t['target']}: {t['value']} ({t['bound']})")


if __name__ == "__main__":
    main()
