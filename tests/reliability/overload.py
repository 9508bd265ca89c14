"""Overload: offered load far above capacity against a small queue.

Flooder processes send decide requests at a fixed rate each (far more than
the tiny model can score) for a while, reading every reply. A bounded queue
must turn the excess away with `overloaded` at once; accepted requests must
wait no longer than the queue allows; the supervisor's memory must stay flat;
and when the flood stops, a well-behaved client must be served as before,
without anyone restarting anything.

Full run (a minute of 16 flooders at 200 requests/s each):

    .venv/bin/python -m tests.reliability.overload --flooders 16 --rate 200 --flood-s 60 --out overload.json

CI runs `run_overload` for 5 seconds (tests/reliability/test_overload.py).
"""
import argparse
import json
import multiprocessing as mp
import sys
import threading
import time
from dataclasses import asdict, dataclass

import zmq

from jevany_daemon import workloads

from .harness import RawDealer, latency_summary, pack, rss_kb, status, stop_processes, unpack, wait_until
from .load import collect

REPLY_WITHIN_S = 120.0
BODY = workloads.short(1, seed=5)[0]


@dataclass(frozen=True)
class OverloadPlan:
    flooders: int = 4
    rate: float = 100.0         # requests per second each flooder offers
    flood_s: float = 5.0
    probes: int = 8             # sequential requests of a well-behaved client, before and after
    sample_s: float = 0.2       # how often the supervisor's RSS is read during the flood


def flooder_main(endpoint: str, plan: OverloadPlan, index: int, ready, start, out) -> None:
    """Send at plan.rate for plan.flood_s, read everything; report outcomes and latencies."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)      # never let the daemon drop a reply we will read
    sock.connect(endpoint)
    payloads = [pack({"v": 1, "id": f"f{index}-{i}", "op": "decide", "body": BODY})
                for i in range(int(plan.rate * plan.flood_s))]
    sent_at: dict = {}
    latencies: dict = {}
    try:
        ready.put(index)
        start.wait()
        began = time.monotonic()
        for i, payload in enumerate(payloads):
            _read_until(sock, began + i / plan.rate, sent_at, latencies)
            sent_at[f"f{index}-{i}"] = time.monotonic()
            sock.send(payload)
        _read_until(sock, time.monotonic() + REPLY_WITHIN_S, sent_at, latencies, stop_when_done=True)
    finally:
        sock.close(linger=0)
        context.term()
        out.put({"sent": len(payloads), "missing": len(sent_at), "latencies": latencies})


def _read_until(sock, until: float, sent_at: dict, latencies: dict, stop_when_done: bool = False) -> None:
    """Take replies until `until`; always everything already waiting, even when behind schedule."""
    while not (stop_when_done and not sent_at):
        wait_ms = max(0, int((until - time.monotonic()) * 1000))
        if not sock.poll(wait_ms):
            return
        reply = unpack(sock.recv())
        sent = sent_at.pop(reply["id"], None)
        if sent is not None:
            outcome = "ok" if reply["ok"] else reply["error"]["code"]
            latencies.setdefault(outcome, []).append(time.monotonic() - sent)
            if reply["ok"]:   # how long its forward pass took: the unit a bounded queue's wait is made of
                latencies.setdefault("forward", []).append(reply["result"]["latency_ms"] / 1000)


def probe(endpoint: str, n: int) -> dict:
    """n decide requests, one at a time, from a fresh well-behaved client: outcomes and latency."""
    seconds, outcomes = [], {}
    with RawDealer(endpoint) as client:
        for i in range(n):
            started = time.monotonic()
            reply = client.call({"v": 1, "id": f"probe-{i}", "op": "decide", "body": BODY}, REPLY_WITHIN_S)
            seconds.append(time.monotonic() - started)
            outcome = "ok" if reply["ok"] else reply["error"]["code"]
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return {"outcomes": outcomes, **latency_summary(seconds)}


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every_s: float):
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.samples: list[int] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.samples.append(rss_kb(self.pid))

    def stop(self) -> list[int]:
        self.stopped.set()
        self.join(10)
        return self.samples


def run_overload(endpoint: str, supervisor_pid: int, plan: OverloadPlan) -> dict:
    before = probe(endpoint, plan.probes)            # also warms the worker up
    rss_before = rss_kb(supervisor_pid)
    scored_before = status(endpoint)["batching"]["requests"]
    ctx = mp.get_context("spawn")
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=flooder_main, args=(endpoint, plan, k, ready, start, out))
             for k in range(plan.flooders)]
    sampler = RssSampler(supervisor_pid, plan.sample_s)
    try:
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)
        sampler.start()
        started = time.monotonic()
        start.set()
        reports = collect(procs, out)
        elapsed = time.monotonic() - started
    finally:
        samples = sampler.stop() if sampler.is_alive() else sampler.samples
        stop_processes(procs)
    settled = wait_until(lambda: (s := status(endpoint))["queue"]["depth"] == 0 and s, 30,
                         "the queue empties after the flood")
    after = probe(endpoint, plan.probes)
    scored = settled["batching"]["requests"] - scored_before
    return summarize(plan, reports, elapsed, before, after, rss_before, samples, rss_kb(supervisor_pid), scored)


def summarize(plan, reports, elapsed, before, after, rss_before, samples, rss_after, scored) -> dict:
    by_outcome: dict = {}
    for r in reports:
        for outcome, seconds in r["latencies"].items():
            by_outcome.setdefault(outcome, []).extend(seconds)
    forward = by_outcome.pop("forward", [])
    return {
        "plan": asdict(plan),
        "elapsed_s": round(elapsed, 3),
        "offered_rps": round(plan.flooders * plan.rate, 1),
        "sent": sum(r["sent"] for r in reports),
        "missing": sum(r["missing"] for r in reports),
        "outcomes": {k: len(v) for k, v in sorted(by_outcome.items())},
        "scored": scored,             # requests the worker scored during the flood, by the daemon's count
        "accepted_rps": round(len(by_outcome.get("ok", [])) / elapsed, 2),
        "latency": {k: latency_summary(v) for k, v in sorted(by_outcome.items())},
        "forward_pass": latency_summary(forward),
        "probe_before": before,
        "probe_after": after,
        "supervisor_rss_kb": {"before": rss_before, "max_during": max(samples, default=rss_before),
                              "after": rss_after, "samples": len(samples)},
    }


def print_report(report: dict) -> None:
    print(f"offered {report['offered_rps']} req/s for {report['plan']['flood_s']}s: sent {report['sent']}, "
          f"missing {report['missing']}, outcomes {report['outcomes']}, accepted {report['accepted_rps']} req/s")
    for outcome, summary in report["latency"].items():
        print(f"  latency {outcome}: {summary}")
    print(f"  forward pass of accepted requests: {report['forward_pass']}")
    print(f"probe before: {report['probe_before']}")
    print(f"probe after:  {report['probe_after']}")
    print(f"supervisor RSS (kB): {report['supervisor_rss_kb']}")


def main(argv=None) -> int:
    from .harness import running_daemon, tiny_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = OverloadPlan()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--max-queue", default="8")
    parser.add_argument("--max-batch-size", default="4")
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args(argv)
    plan = OverloadPlan(**{k: getattr(args, k) for k in asdict(defaults)})
    with running_daemon(tiny_model_dir(), "--max-queue", args.max_queue,
                        "--max-batch-size", args.max_batch_size) as daemon:
        report = run_overload(daemon.endpoint, daemon.proc.pid, plan)
    print_report(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
