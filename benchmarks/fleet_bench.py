"""Routing over a fleet, measured: four daemons on this machine, one of them slower, under
round_robin, least_loaded and affinity, in one run.

    python benchmarks/fleet_bench.py            # about 10 minutes on 2 cores; --quick: fewer turns

Four `jevany-daemon serve` processes serve the tiny qwen3 model (choice readout), one CPU
worker and one torch thread each, group commit up to 16, a prefix cache of CACHE_ENTRIES
states each; the last is made slower (benchmarks/slowdown: each pass through the backbone
waits as long again as it took). Clients are real processes (fleet_load.py), each one
AsyncJevClient over all four.

- agent: SESSIONS sessions whose transcript grows 40-80 tokens a turn from 450-900 tokens
  (past the affinity key's first kilobyte), each waiting for its answer before its next
  turn: more sessions than a daemon's cache holds, so only a router that keeps a session on
  one daemon finds its previous turn there;
- same_state: a suite's eight questions about each state, 32 requests in flight.

Every policy meets the same requests, each daemon's cache emptied before it (clear_cache).
Reported per policy: throughput, p99 latency, the prefix-cache hit rate (of the prompt
tokens past the pinned head, the share not computed again) and the share of each daemon.
Then: the agent workload under affinity with one daemon sent SIGTERM mid-run (it drains;
its sessions move), counting errors that reached callers and requests lost; and a suite
sharded over two private daemons (jevany-eval --shard, --serve) then merged, against one
run, all three at --max-batch-size 1 and no prefix cache, whose reports must be identical.
JSON goes to benchmarks/results/cpu-fp32-tiny-fleet.json.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import percentile
from jevany_client import JevClient, JevTimeoutError
from jevany_daemon import workloads
from jevany_daemon.model.tiny import build_tiny_model

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
ROUTINGS = ("round_robin", "least_loaded", "affinity")
DAEMONS = 4
CACHE_ENTRIES = 12
SESSIONS = 32
CLIENT_PROCESSES = 4
SLOWDOWN = "1.0"


class FleetDaemon:
    def __init__(self, model: Path, name: str, slow: bool):
        self.name, self.slow = name, slow
        self.dir = Path(tempfile.mkdtemp(prefix="jv-fleet-"))
        self.endpoint, self.control = f"ipc://{self.dir}/d.sock", f"ipc://{self.dir}/c.sock"
        env = {**os.environ, "JEVANY_LOG_LEVEL": "WARNING"}
        if slow:
            env |= {"PYTHONPATH": str(HERE / "slowdown"), "JEVANY_BENCH_SLOWDOWN": SLOWDOWN}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jevany_daemon", "serve", "--model", str(model), "--bind", self.endpoint,
             "--control", self.control, "--workers", "1", "--cpu-threads", "1", "--max-batch-size", "16",
             "--prefix-cache", str(CACHE_ENTRIES), "--max-queue", "4096"], env=env)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 600
        with JevClient(self.endpoint, timeout=1.0, retries=0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"daemon {self.name} exited during start-up")
                try:
                    if client.status()["state"] == "ready":
                        return
                except JevTimeoutError:
                    pass
                time.sleep(0.2)     # loading; poll again
        raise RuntimeError(f"daemon {self.name} not ready")

    def status(self) -> dict:
        with JevClient(self.endpoint, timeout=30) as client:
            return client.status()

    def clear(self) -> None:
        with JevClient(self.control, timeout=60) as client:
            client.clear_cache()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)
        shutil.rmtree(self.dir, ignore_errors=True)


# --- clients -------------------------------------------------------------------------------

def run_clients(endpoints: list[str], routing: str, sessions: list[list[dict]], concurrency: int,
                work: Path, started: threading.Event | None = None) -> dict:
    """Sessions spread over CLIENT_PROCESSES processes; all start together; their figures joined."""
    procs = []
    for k in range(CLIENT_PROCESSES):
        task = work / f"task-{routing}-{k}.json"
        task.write_text(json.dumps({"endpoints": endpoints, "routing": routing, "sessions": sessions[k::CLIENT_PROCESSES],
                                    "concurrency": concurrency, "timeout": 600}))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "fleet_load.py"), str(task)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    if started is not None:
        started.set()
    outs = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        p.wait(60)
    return {"latencies": [t for o in outs for t in o["latencies"]], "errors": [e for o in outs for e in o["errors"]],
            "answered": sum(o["answered"] for o in outs), "input_tokens": sum(o["input_tokens"] for o in outs),
            "wall_s": max(o["ended"] for o in outs) - min(o["started"] for o in outs),
            "sent": sum(len(s) for s in sessions)}


def measure(daemons: list[FleetDaemon], routing: str, sessions, concurrency: int, work: Path) -> dict:
    for d in daemons:
        d.clear()
    before = [d.status() for d in daemons]
    run = run_clients([d.endpoint for d in daemons], routing, sessions, concurrency, work)
    after = [d.status() for d in daemons]
    served = [a["batching"]["requests"] - b["batching"]["requests"] for a, b in zip(after, before)]
    reused = sum(a["prefix_cache"]["reused_tokens"] - b["prefix_cache"]["reused_tokens"] for a, b in zip(after, before))
    pinned = after[0]["prefix_cache"].get("pinned_tokens", 0) * sum(served)
    return {"rps": run["answered"] / run["wall_s"], "p99_ms": percentile(run["latencies"], 0.99) * 1000,
            "p50_ms": percentile(run["latencies"], 0.5) * 1000,
            "hit_rate": (reused - pinned) / max(1, run["input_tokens"] - pinned),
            "shares": {d.name: n / max(1, sum(served)) for d, n in zip(daemons, served)},
            "errors": len(run["errors"]), "answered": run["answered"], "sent": run["sent"]}


def drained_mid_run(daemons: list[FleetDaemon], sessions, work: Path) -> dict:
    """Affinity, and daemon d1 sent SIGTERM once a third of the requests are answered."""
    for d in daemons:
        d.clear()
    target, victim = daemons[1], daemons[1]
    total = sum(len(s) for s in sessions)
    before = sum(d.status()["batching"]["requests"] for d in daemons)
    started, box = threading.Event(), {}
    runner = threading.Thread(target=lambda: box.update(run=run_clients(
        [d.endpoint for d in daemons], "affinity", sessions, len(sessions), work, started)))
    runner.start()
    started.wait()
    while sum(d.status()["batching"]["requests"] for d in daemons) - before < total // 3:
        time.sleep(0.2)          # polling the fleet's progress to pick the moment of the signal
    victim.proc.send_signal(signal.SIGTERM)
    drained = victim.proc.wait(120)
    runner.join()
    run = box["run"]
    return {"sent": total, "answered": run["answered"], "errors": len(run["errors"]),
            "lost": total - run["answered"] - len(run["errors"]), "error_examples": run["errors"][:3],
            "drained_daemon_exit": drained, "signalled": target.name}


# --- the sharded eval ------------------------------------------------------------------------

def sharded_eval(model: Path, work: Path, n: int) -> dict:
    bodies = workloads.same_state(n, seed=77, per_state=4)
    lines = []
    for body in bodies:
        [(qid, question)] = body["questions"].items()
        label = {"choice": lambda q: next(iter(q["criteria"])), "noul": lambda q: True,
                 "score": lambda q: 0}[question["type"]](question)
        lines.append(json.dumps({**body, "labels": {qid: label}}))
    suite = work / "suite.jsonl"
    suite.write_text("\n".join(lines) + "\n")
    serve = f"--model {model} --max-batch-size 1 --prefix-cache 0 --workers 1 --cpu-threads 1"

    def run(*args: str) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / "jevany-eval"), str(suite), "--serve", serve, "--no-progress", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    shards = [run("--shard", f"{i}/2", "--out", str(work / f"s{i}.jsonl")) for i in range(2)]
    outputs = [p.communicate(timeout=1200)[0] for p in shards]
    single = run("--out", str(work / "single.jsonl"), "--report", str(work / "single.json"))
    outputs.append(single.communicate(timeout=1200)[0])
    merged = subprocess.run([str(BIN / "jevany-eval"), "merge", str(suite), str(work / "s0.jsonl"),
                             str(work / "s1.jsonl"), "--out", str(work / "merged.jsonl"), "--report",
                             str(work / "merged.json")], capture_output=True, text=True)
    codes = [p.returncode for p in shards] + [single.returncode, merged.returncode]
    identical = codes == [0, 0, 0, 0] and (work / "merged.json").read_bytes() == (work / "single.json").read_bytes()
    return {"items": n, "exit_codes": codes, "identical_report": identical,
            "shard_items": [len((work / f"s{i}.jsonl").read_text().splitlines()) for i in range(2)],
            "output_tail": [o[-300:] for o in outputs] if not identical else None}


# --- the run -------------------------------------------------------------------------------------

def agent_sessions(turns: int) -> list[list[dict]]:
    bodies = workloads.agent(SESSIONS, turns, seed=11, start=(450, 900))
    return [bodies[s::SESSIONS] for s in range(SESSIONS)]


def targets(result: dict) -> list[dict]:
    agent, rr = result["agent"]["affinity"], result["agent"]["round_robin"]
    slow = f"d{DAEMONS - 1}"
    rows = [
        ("agent workload, affinity vs round robin: prefix-cache hit rate", ">= 2x",
         agent["hit_rate"] / max(rr["hit_rate"], 1e-9), lambda v: v >= 2),
        ("agent workload, affinity vs round robin: throughput", ">= 1.5x", agent["rps"] / rr["rps"], lambda v: v >= 1.5),
        ("slow daemon's share of requests, least_loaded vs round robin", "<= 0.6x",
         result["agent"]["least_loaded"]["shares"][slow] / rr["shares"][slow], lambda v: v <= 0.6),
        ("a daemon drained mid-run (SIGTERM)", "0 errors, 0 lost",
         (result["drain"]["errors"], result["drain"]["lost"]), lambda v: v == (0, 0)),
        ("sharded eval (2 shards, 2 daemons) then merge, vs one run at --max-batch-size 1", "identical report",
         result["sharded_eval"]["identical_report"], bool),
    ]
    return [{"figure": f, "target": t, "measured": v, "met": ok(v)} for f, t, v, ok in rows]


def show(name: str, by_routing: dict) -> None:
    print(f"\n{name}")
    print(f"  {'routing':13} {'req/s':>7} {'p99 ms':>8} {'hit rate':>9}  shares (d0..d3, d3 slow)  errors")
    for routing, m in by_routing.items():
        shares = " ".join(f"{s:.2f}" for s in m["shares"].values())
        print(f"  {routing:13} {m['rps']:7.1f} {m['p99_ms']:8.0f} {m['hit_rate']:9.2f}  {shares:24}  {m['errors']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns and items")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jv-fleet-work-"))
    model = build_tiny_model(work / "tiny", arch="qwen3", readout="choice", seed=0)
    turns, n_same = (5, 64) if args.quick else (10, 128)
    result = {"daemons": DAEMONS, "cache_entries": CACHE_ENTRIES, "sessions": SESSIONS, "turns": turns,
              "client_processes": CLIENT_PROCESSES, "slowdown": float(SLOWDOWN)}
    daemons = [FleetDaemon(model, f"d{i}", slow=i == DAEMONS - 1) for i in range(DAEMONS)]
    try:
        for d in daemons:
            d.wait_ready()
        warm = [[b] for b in workloads.short(32, seed=5)]
        run_clients([d.endpoint for d in daemons], "round_robin", warm, 4, work)
        sessions = agent_sessions(turns)
        result["agent"] = {r: measure(daemons, r, sessions, SESSIONS // CLIENT_PROCESSES, work) for r in ROUTINGS}
        show(f"agent: {SESSIONS} sessions x {turns} turns, cache {CACHE_ENTRIES} states a daemon", result["agent"])
        same = [[b] for b in workloads.same_state(n_same, seed=21, per_state=8)]
        result["same_state"] = {r: measure(daemons, r, same, 8, work) for r in ROUTINGS}
        show(f"same_state: {n_same} requests, 8 a state, 32 in flight", result["same_state"])
        result["drain"] = drained_mid_run(daemons, agent_sessions(turns), work)
        print(f"\ndrain mid-run: {result['drain']}")
    finally:
        for d in daemons:
            d.stop()
    result["sharded_eval"] = sharded_eval(model, work, 32 if args.quick else 64)
    print(f"sharded eval: {result['sharded_eval']}")
    result["targets"] = targets(result)
    print("\n| figure | target | measured | met |\n|---|---|---|---|")
    for row in result["targets"]:
        measured = row["measured"]
        text = f"{measured:.2f}x" if isinstance(measured, float) else str(measured)
        print(f"| {row['figure']} | {row['target']} | {text} | {'yes' if row['met'] else 'NO'} |")
    out = HERE / "results" / "cpu-fp32-tiny-fleet.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
