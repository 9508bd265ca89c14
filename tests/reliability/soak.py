"""Soak: moderate load for a long time; the daemon's memory and file descriptors must not grow.

Client processes use the real JevClient, with retries off so that an
`overloaded` or `worker_lost` shows instead of being retried away, each
sending a paced stream of decide requests (short and mixed workloads, one in
ten invalid) plus the odd ping and status; every answer must pass JevAny's
self-check. Every `sample_s` the supervisor's and the worker's VmRSS and
open file descriptors are read from /proc (the worker's pid comes from the
`status` op). After the warm-up, RSS may grow by at most 5% and the fd counts'
floor (the least of the last third of the samples against the least of the
first third) not at all; every request must get its expected outcome; the worker must
never restart.

The full run, documented for release checks (scripts/soak.py is the same):

    .venv/bin/python scripts/soak.py --duration-s 1800 --warmup-s 300 --sample-s 60 --out soak.json

CI runs 60 s, sampling every 5 s (tests/reliability/test_soak.py).
"""
import argparse
import json
import multiprocessing as mp
import sys
import time
from dataclasses import asdict, dataclass

from jevany_client import JevClient, JevanyError
from jevany_daemon import workloads
from jevany_daemon.parity import answer_problems

from .harness import fd_count, latency_summary, rss_kb, stop_processes

REPLY_WITHIN_S = 60.0


@dataclass(frozen=True)
class SoakPlan:
    duration_s: float = 60.0
    warmup_s: float = 20.0
    sample_s: float = 5.0
    clients: int = 2
    rate: float = 5.0               # requests per second per client: moderate, well below capacity
    max_rss_growth: float = 0.05


def client_main(endpoint: str, plan: SoakPlan, index: int, ready, stop, out) -> None:
    bodies = workloads.short(32, seed=100 + index) + workloads.mixed(32, seed=200 + index, max_words=40)
    outcomes: dict = {}
    latencies: list = []
    wrong: list = []
    with JevClient(endpoint, timeout=REPLY_WITHIN_S, retries=0) as client:
        client.ping()
        ready.put(index)
        began = time.monotonic()
        n = 0
        while not stop.is_set():
            kind, outcome, seconds = _one(client, bodies, n)
            key = f"{kind}:{outcome}"
            outcomes[key] = outcomes.get(key, 0) + 1
            latencies.append(seconds)
            if outcome != {"decide": "ok", "invalid": "invalid_request", "ping": "ok", "status": "ok"}[kind]:
                wrong.append(key)
            n += 1
            stop.wait(max(0.0, began + n / plan.rate - time.monotonic()))   # pace, or stop at once
    out.put({"outcomes": outcomes, "latency": latency_summary(latencies), "wrong": wrong[:20]})


def _one(client: JevClient, bodies: list, n: int) -> tuple[str, str, float]:
    body = bodies[n % len(bodies)]
    kind, call = "decide", lambda: client.call("decide", body)
    if n % 50 == 25:
        kind, call = "ping", client.ping
    elif n % 50 == 48:
        kind, call = "status", client.status
    elif n % 10 == 9:
        kind, call = "invalid", lambda: client.call("decide", {**body, "questions": {}})
    started = time.monotonic()
    try:
        result = call()
    except JevanyError as err:
        return kind, err.code, time.monotonic() - started
    seconds = time.monotonic() - started
    return kind, "bad_answer" if kind == "decide" and answer_problems(body, result) else "ok", seconds


class Sampler:
    """VmRSS and fd counts of the supervisor and its worker, one row per sample."""

    def __init__(self, endpoint: str, supervisor_pid: int):
        self.status_client = JevClient(endpoint, timeout=10)   # one connection: no fd churn of its own
        self.supervisor = supervisor_pid
        self.worker = self.worker_pid()
        self.rows: list[dict] = []

    def worker_pid(self) -> int:
        workers = self.status_client.status()["workers"]
        return workers[0]["pid"]

    def sample(self, at: float) -> dict:
        row = {"t_s": round(at, 1), "worker_pid": self.worker_pid(),
               "supervisor_rss_kb": rss_kb(self.supervisor), "supervisor_fds": fd_count(self.supervisor),
               "worker_rss_kb": rss_kb(self.worker), "worker_fds": fd_count(self.worker)}
        self.rows.append(row)
        return row

    def close(self) -> None:
        self.status_client.close()


def run_soak(endpoint: str, supervisor_pid: int, plan: SoakPlan, echo=lambda row: None) -> dict:
    ctx = mp.get_context("spawn")
    ready, out, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=client_main, args=(endpoint, plan, k, ready, stop, out))
             for k in range(plan.clients)]
    sampler = Sampler(endpoint, supervisor_pid)
    try:
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)
        began = time.monotonic()
        next_sample = began
        while next_sample <= began + plan.duration_s:
            time.sleep(max(0.0, next_sample - time.monotonic()))   # the sampling clock, not a sync point
            echo(sampler.sample(time.monotonic() - began))
            next_sample += plan.sample_s
        stop.set()
        reports = [out.get(timeout=REPLY_WITHIN_S * 2) for _ in procs]
    finally:
        stop.set()
        stop_processes(procs, grace_s=REPLY_WITHIN_S)
        sampler.close()
    return summarize(plan, sampler.rows, reports)


def summarize(plan: SoakPlan, rows: list[dict], reports: list[dict]) -> dict:
    settled = [r for r in rows if r["t_s"] >= plan.warmup_s] or rows[-1:]
    first, last = settled[0], settled[-1]
    outcomes: dict = {}
    for r in reports:
        for key, n in r["outcomes"].items():
            outcomes[key] = outcomes.get(key, 0) + n
    return {
        "plan": asdict(plan),
        "outcomes": dict(sorted(outcomes.items())),
        "wrong": [w for r in reports for w in r["wrong"]],
        "latency": [r["latency"] for r in reports],
        "rss_growth": {who: round((last[f"{who}_rss_kb"] - first[f"{who}_rss_kb"]) / first[f"{who}_rss_kb"], 4)
                       for who in ("supervisor", "worker")},
        "fds": {who: fd_trend([r[f"{who}_fds"] for r in settled]) for who in ("supervisor", "worker")},
        "worker_pids": sorted({r["worker_pid"] for r in rows}),
        "samples": rows,
    }


def fd_trend(counts: list[int]) -> dict:
    """The floor of the first and the last third of the samples after warm-up: a descriptor open for a
    moment when a sample is read (a /proc listing, a connection being set up) lifts one sample, a leak
    lifts the floor."""
    third = max(1, len(counts) // 3)
    return {"after_warmup": counts[0], "max_after": max(counts), "last": counts[-1],
            "floor_first": min(counts[:third]), "floor_last": min(counts[-third:])}


def problems(report: dict) -> list[str]:
    found = []
    limit = report["plan"]["max_rss_growth"]
    for who, growth in report["rss_growth"].items():
        if growth > limit:
            found.append(f"{who} RSS grew {growth:.1%} after warm-up (limit {limit:.0%})")
    for who, fds in report["fds"].items():
        if fds["floor_last"] > fds["floor_first"]:
            found.append(f"{who} file descriptors grew: {fds}")
    if len(report["worker_pids"]) != 1:
        found.append(f"the worker was replaced: pids {report['worker_pids']}")
    if report["wrong"]:
        found.append(f"unexpected outcomes: {report['wrong'][:10]}")
    if not report["outcomes"].get("decide:ok"):
        found.append("no decide request succeeded")
    return found


def print_report(report: dict) -> None:
    print(f"soak {report['plan']['duration_s']}s: outcomes {report['outcomes']}")
    print(f"latency per client: {report['latency']}")
    print(f"RSS growth after warm-up: {report['rss_growth']}; fds: {report['fds']}")


def main(argv=None) -> int:
    from .harness import running_daemon, tiny_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = SoakPlan()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--max-batch-size", default="8")
    parser.add_argument("--out", help="write the report, with every sample, as JSON here")
    args = parser.parse_args(argv)
    plan = SoakPlan(**{k: getattr(args, k) for k in asdict(defaults)})
    with running_daemon(tiny_model_dir(), "--max-batch-size", args.max_batch_size) as daemon:
        report = run_soak(daemon.endpoint, daemon.proc.pid, plan, echo=lambda row: print(row, flush=True))
    print_report(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    found = problems(report)
    for line in found:
        print("PROBLEM:", line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
