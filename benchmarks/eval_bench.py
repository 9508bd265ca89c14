"""jevany-eval's throughput against the daemon's own, on the same requests, in the same run.

    python benchmarks/eval_bench.py              # 2,000 items, 3 rounds
    python benchmarks/eval_bench.py --quick      # 400 items, 1 round
    python benchmarks/eval_bench.py --items 1000 --concurrency 16

One daemon (tiny model, --max-batch-size 32) serves both measurements, in
alternating order each round:
- the daemon's own throughput: `concurrency` closed-loop client processes
  (loadgen.py, the way bench.py saturates a daemon) send every request once;
- the eval: `jevany-eval SUITE --concurrency N` as a user runs it, on a
  suite whose lines are those same requests plus labels, into a fresh
  results file each round. Its rate is the run's own (first request to last
  result written, which the command prints); the whole command's time,
  start-up, suite reading and the report's bootstrap included, is recorded
  too.
The figure is the median over rounds of eval rate / daemon rate (target >= 0.9).
On a shared, busy machine both rates drift; the client CPU each spends per
item (the eval process against the loadgen processes) is recorded too, as a
figure that load moves less. Writes JSON to --out.
"""
import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import HERE, ClientPool, Daemon, machine, median, write_result
from jevany_daemon import workloads
from jevany_daemon.model.tiny import build_tiny_model

EVAL = Path(sys.executable).parent / "jevany-eval"
RATE = re.compile(r"(\d+) items finished by this run in ([\d.]+) s")


def labelled(bodies: list[dict], seed: int) -> list[dict]:
    """The bodies as suite lines: a random expected answer for each question (the tiny model is random too)."""
    rng = random.Random(seed)
    lines = []
    for body in bodies:
        labels = {}
        for qid, q in body["questions"].items():
            if q["type"] == "choice":
                labels[qid] = rng.choice(sorted(q["criteria"]))
            elif q["type"] == "noul":
                labels[qid] = rng.random() < 0.5
            else:
                labels[qid] = rng.randrange(len(q["criteria"]))
        lines.append({**body, "labels": labels})
    return lines


def eval_round(suite: Path, endpoint: str, concurrency: int, out: Path) -> dict:
    out.unlink(missing_ok=True)
    cpu_before = _children_cpu_s()
    started = time.perf_counter()
    done = subprocess.run([str(EVAL), str(suite), "--endpoint", endpoint, "--out", str(out),
                           "--concurrency", str(concurrency), "--no-progress"],
                          capture_output=True, text=True, timeout=3600)
    command_s = time.perf_counter() - started
    cpu_s = _children_cpu_s() - cpu_before       # the eval process's own CPU, start-up and report included
    if done.returncode != 0:
        raise RuntimeError(f"jevany-eval exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    found = RATE.search(done.stdout)
    items, run_s = int(found[1]), float(found[2])
    return {"items": items, "run_s": run_s, "rps": items / run_s, "command_s": command_s,
            "client_cpu_ms_per_item": cpu_s * 1000 / items}


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished children (the eval command, once waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="400 items, one round")
    p.add_argument("--items", type=int, help="items per measurement (default 2,000; 400 with --quick)")
    p.add_argument("--rounds", type=int, help="rounds (default 3; 1 with --quick)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight, for both measurements")
    p.add_argument("--out", type=Path, default=HERE / "results" / "cpu-fp32-tiny-eval.json")
    args = p.parse_args()
    n_items = args.items or (400 if args.quick else 2000)
    n_rounds = args.rounds or (1 if args.quick else 3)

    root = Path(tempfile.mkdtemp(prefix="jv-eval-bench-"))
    model = build_tiny_model(root / "qwen3-choice", arch="qwen3", readout="choice", seed=0)
    bodies = workloads.short(n_items, seed=3)
    suite = root / "suite.jsonl"
    suite.write_text("".join(json.dumps(line) + "\n" for line in labelled(bodies, seed=4)))
    settings = argparse.Namespace(device="cpu", dtype="fp32", serve_args=[])
    daemon = Daemon(model, settings, batch=32, policy="adaptive")
    pool = ClientPool(args.concurrency)
    rounds = []
    try:
        pool.run(daemon, workloads.short(64, seed=1), 8)                     # warm the daemon
        for r in range(n_rounds):
            order = ("daemon", "eval") if r % 2 == 0 else ("eval", "daemon")
            measured = {}
            for what in order:
                if what == "daemon":
                    run = pool.run(daemon, bodies, args.concurrency)
                    measured["daemon"] = {"rps": run["rps"], "mean_batch_size": run["mean_batch_size"],
                                          # the closed-loop client processes' CPU, for the eval's to compare with
                                          "client_cpu_ms_per_item": (run["client_cores"] or 0) * 1000 / run["rps"]}
                else:
                    measured["eval"] = eval_round(suite, daemon.endpoint, args.concurrency, root / "results.jsonl")
            measured["ratio"] = measured["eval"]["rps"] / measured["daemon"]["rps"]
            rounds.append(measured)
            print(f"round {r + 1}: daemon {measured['daemon']['rps']:.1f} req/s, eval {measured['eval']['rps']:.1f} "
                  f"items/s ({measured['ratio']:.2f}x); the whole command {measured['eval']['command_s']:.1f} s; client "
                  f"CPU per item: eval {measured['eval']['client_cpu_ms_per_item']:.2f} ms, loadgen "
                  f"{measured['daemon']['client_cpu_ms_per_item']:.2f} ms")
    finally:
        pool.close()
        daemon.stop()
    ratio = median([r["ratio"] for r in rounds])
    result = {
        "machine": machine(loadavg_at_end=os.getloadavg()),
        "settings": {"model": "tiny qwen3, choice readout, fp32, cpu", "max_batch_size": 32, "items": n_items,
                     "rounds": n_rounds, "concurrency": args.concurrency, "workload": "workloads.short(seed=3)",
                     "quick": args.quick},
        "rounds": rounds,
        "daemon_rps": median([r["daemon"]["rps"] for r in rounds]),
        "eval_rps": median([r["eval"]["rps"] for r in rounds]),
        "eval_throughput_ratio": ratio,
        "targets": {"eval_at_least_0.9x_daemon": ratio >= 0.9},
    }
    print(f"{n_items} items, {args.concurrency} in flight: daemon {result['daemon_rps']:.1f} req/s, "
          f"jevany-eval {result['eval_rps']:.1f} items/s: {ratio:.2f}x (target >= 0.9x: "
          f"{'met' if ratio >= 0.9 else 'NOT met'})")
    write_result(result, args.out)


if __name__ == "__main__":
    main()
