"""Load without loss: many client processes, mixed requests, every reply accounted for.

Each client process keeps a window of requests in flight on a raw DEALER:
valid decide requests (short and mixed workloads), some with short deadlines
(`timeout_ms`; a deadline of 0 has always passed, so those must come back
`deadline_exceeded`), some invalid in six different ways, and a few clients that
close their socket mid-stream with requests in flight and carry on over a new
one. Every request must get exactly one reply, matched by id, on the socket
that sent it; every answer must equal serial in-process scoring of the same
body (max probability difference <= 1e-5, no decision changed); every invalid
request must get its own error code.

Full run (the tiny model on 2 CPU cores scores some 30-60 requests a second, so
budget about an hour):

    .venv/bin/python -m tests.reliability.load --processes 64 --requests 2000 --out load.json

CI runs `run_load` with 8 processes x 50 requests (tests/reliability/test_load.py).
"""
import argparse
import json
import multiprocessing as mp
import queue
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import zmq

from jevany_daemon import workloads
from jevany_daemon.parity import answer_problems, compare, worst

from .harness import accounted, latency_summary, pack, status, stop_processes, unpack

REPLY_WITHIN_S = 300.0    # longest wait for any one reply before a request is declared lost
MAX_DIFF = 1e-5
DEADLINES_MS = (0, 1, 5, 20, 50)   # 0 must expire; the others may, depending on the queue


@dataclass(frozen=True)
class LoadPlan:
    processes: int = 8
    requests: int = 50              # per process
    distinct: int = 24              # distinct valid bodies, each scored once serially for reference
    window: int = 4                 # requests each client keeps in flight
    invalid_share: float = 0.08
    deadline_share: float = 0.08
    disconnecting: int = 1          # clients that drop their socket mid-stream and reconnect
    seed: int = 0


def bodies_for(plan: LoadPlan) -> list[dict]:
    half = plan.distinct // 2
    return (workloads.short(half, seed=plan.seed)
            + workloads.mixed(plan.distinct - half, seed=plan.seed + 1, max_words=30))


# Invalid requests: how each is built from an id and a good body, and the code it must get.
INVALID = {
    "nan": (lambda rid, b: pack({"v": 1, "id": rid, "op": "decide", "body": {**b, "state": float("nan")}}),
            "invalid_request"),
    "no_questions": (lambda rid, b: pack({"v": 1, "id": rid, "op": "decide", "body": {**b, "questions": {}}}),
                     "invalid_request"),
    "unknown_model": (lambda rid, b: pack({"v": 1, "id": rid, "op": "decide", "body": {**b, "model": "nope"}}),
                      "unknown_model"),
    "unknown_op": (lambda rid, b: pack({"v": 1, "id": rid, "op": "explode"}), "unknown_op"),
    "version": (lambda rid, b: pack({"v": 2, "id": rid, "op": "decide", "body": b}), "unsupported_version"),
    "garbage": (lambda rid, b: b"\xc1" + rid.encode(), "invalid_message"),   # no readable id: replied with null
}


@dataclass
class ClientReport:
    client: int
    sent: int = 0
    replies: int = 0
    abandoned: int = 0              # in flight when the client dropped its socket; never awaited
    missing: list = field(default_factory=list)       # ids that got no reply in time
    unexpected: list = field(default_factory=list)    # replies for ids not in flight on this socket
    wrong: list = field(default_factory=list)         # replies with the wrong outcome
    outcomes: dict = field(default_factory=dict)      # "ok" or error code -> count, per kind
    max_abs_diff: float = 0.0
    decisions_changed: int = 0
    compared: int = 0
    latencies: list = field(default_factory=list)     # seconds, every reply
    ok_latencies: list = field(default_factory=list)


def schedule(plan: LoadPlan, client: int) -> list[tuple[str, str, int]]:
    """[(id, kind, body index)]: the same for a given plan, client and seed."""
    rng = random.Random(plan.seed * 1_000_003 + client)
    out = []
    for i in range(plan.requests):
        r = rng.random()
        if r < plan.invalid_share:
            kind = rng.choice(sorted(INVALID))
        elif r < plan.invalid_share + plan.deadline_share:
            kind = "deadline"
        else:
            kind = "valid"
        out.append((f"c{client}-{i}", kind, rng.randrange(plan.distinct)))
    return out


def deadline_ms(rid: str) -> int:
    return random.Random(rid).choice(DEADLINES_MS)


def allowed(kind: str, rid: str) -> set:
    """The outcomes a request may end with."""
    if kind == "deadline":
        return {"deadline_exceeded"} if deadline_ms(rid) == 0 else {"ok", "deadline_exceeded"}
    return {"valid": {"ok"}}.get(kind) or {INVALID[kind][1]}


class _Client:
    """One client process's socket, its requests in flight, and what came back."""

    def __init__(self, endpoint: str, plan: LoadPlan, index: int, bodies: list, expected: list):
        self.endpoint, self.plan, self.bodies, self.expected = endpoint, plan, bodies, expected
        self.report = ClientReport(index)
        self.context = zmq.Context()
        self.sock = self._connect()
        self.inflight: dict = {}     # id -> (sent at, kind, body index)
        self.null_ids: list = []     # ids of garbage in flight, oldest first: their replies carry id null

    def _connect(self):
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        return sock

    def send(self, rid: str, kind: str, index: int) -> None:
        body = self.bodies[index]
        if kind == "valid":
            payload = pack({"v": 1, "id": rid, "op": "decide", "body": body})
        elif kind == "deadline":
            payload = pack({"v": 1, "id": rid, "op": "decide", "body": body, "timeout_ms": deadline_ms(rid)})
        else:
            payload = INVALID[kind][0](rid, body)
            if kind == "garbage":
                self.null_ids.append(rid)
        self.sock.send(payload)
        self.inflight[rid] = (time.monotonic(), kind, index)
        self.report.sent += 1

    def receive(self, timeout_s: float) -> bool:
        if not self.sock.poll(int(timeout_s * 1000)):
            return False
        while True:
            try:
                self.take(unpack(self.sock.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return True

    def take(self, reply: dict) -> None:
        now = time.monotonic()
        rid = reply.get("id")
        if rid is None and self.null_ids:
            rid = self.null_ids.pop(0)
        if rid not in self.inflight:
            self.report.unexpected.append(repr(rid)[:80])
            return
        sent, kind, index = self.inflight.pop(rid)
        outcome = "ok" if reply.get("ok") else reply.get("error", {}).get("code")
        r = self.report
        r.replies += 1
        r.latencies.append(now - sent)
        r.outcomes[f"{kind}:{outcome}"] = r.outcomes.get(f"{kind}:{outcome}", 0) + 1
        self.check(rid, kind, index, outcome, reply)
        if outcome == "ok":
            r.ok_latencies.append(now - sent)

    def check(self, rid: str, kind: str, index: int, outcome: str, reply: dict) -> None:
        if outcome not in allowed(kind, rid):
            self.report.wrong.append(f"{rid} ({kind}): {outcome}: {reply.get('error', {}).get('message', '')[:120]}")
            return
        if outcome == "ok":
            self.report.wrong += [f"{rid}: {p}" for p in answer_problems(self.bodies[index], reply["result"])]
            diff = compare([self.expected[index]], [reply["result"]])
            self.report.compared += 1
            self.report.max_abs_diff = worst([self.report.max_abs_diff, diff["max_abs_diff"]])
            self.report.decisions_changed += len(diff["decisions_changed"])

    def drop_socket(self) -> None:
        """Close with requests in flight and go on over a new socket (a new identity to the daemon)."""
        self.report.abandoned += len(self.inflight)
        self.inflight.clear()
        self.null_ids.clear()
        self.sock.close(linger=0)
        self.sock = self._connect()

    def close(self) -> None:
        self.sock.close(linger=0)
        self.context.term()


def client_main(endpoint: str, plan: LoadPlan, index: int, bodies: list, expected: list,
                ready, start, out) -> None:
    client = _Client(endpoint, plan, index, bodies, expected)
    try:
        todo = schedule(plan, index)
        drop_at = len(todo) // 2 if index < plan.disconnecting else None
        ready.put(index)
        start.wait()
        for n, item in enumerate(todo):
            if n == drop_at:
                while not client.inflight:     # make sure something is in flight when it drops
                    client.receive(REPLY_WITHIN_S)
                client.drop_socket()
            while len(client.inflight) >= plan.window:
                if not client.receive(REPLY_WITHIN_S):
                    break
            client.send(*item)
        while client.inflight and client.receive(REPLY_WITHIN_S):
            pass
        client.report.missing = sorted(client.inflight)
    finally:
        client.close()
        out.put(asdict(client.report))


def run_load(endpoint: str, plan: LoadPlan, reference) -> dict:
    """Run the plan against a ready daemon; `reference(bodies)` gives serial in-process answers."""
    bodies = bodies_for(plan)
    expected = reference(bodies)
    before = status(endpoint)
    ctx = mp.get_context("spawn")
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=client_main, args=(endpoint, plan, k, bodies, expected, ready, start, out))
             for k in range(plan.processes)]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)
        started = time.monotonic()
        start.set()
        reports = collect(procs, out)
        elapsed = time.monotonic() - started
    finally:
        stop_processes(procs, grace_s=30)
    return summarize(plan, reports, elapsed, before, _settled_status(endpoint, before, reports))


def collect(procs: list, out) -> list:
    """One report per client process; fails if a process dies without one."""
    reports = []
    while len(reports) < len(procs):
        try:
            reports.append(out.get(timeout=5))
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and out.empty():
                raise RuntimeError(f"client processes died: {[p.exitcode for p in procs]}") from None
    return reports


def _settled_status(endpoint: str, before: dict, reports: list) -> dict:
    # Abandoned requests may still be queued or scoring; wait until the daemon has accounted for them all
    # (answered, or dropped unscored once their client had left).
    sent = sum(r["sent"] for r in reports)
    deadline = time.monotonic() + REPLY_WITHIN_S
    while True:
        after = status(endpoint)
        if _counted(after) - _counted(before) - 1 >= sent or time.monotonic() > deadline:
            return after
        time.sleep(0.1)   # polling the daemon's counters, bounded by the deadline above


def _counted(s: dict) -> int:
    return accounted(s["requests"])


def summarize(plan: LoadPlan, reports: list, elapsed: float, before: dict, after: dict) -> dict:
    outcomes: dict = {}
    for r in reports:
        for key, n in r["outcomes"].items():
            outcomes[key] = outcomes.get(key, 0) + n
    sent = sum(r["sent"] for r in reports)
    ok = sum(n for key, n in outcomes.items() if key.endswith(":ok"))
    every = [s for r in reports for s in r["latencies"]]
    batching = after["batching"]
    return {
        "plan": asdict(plan),
        "elapsed_s": round(elapsed, 3),
        "sent": sent,
        "replies": sum(r["replies"] for r in reports),
        "abandoned": sum(r["abandoned"] for r in reports),
        "missing": [m for r in reports for m in r["missing"]],
        "unexpected": [u for r in reports for u in r["unexpected"]],
        "wrong": [w for r in reports for w in r["wrong"]][:50],
        "outcomes": dict(sorted(outcomes.items())),
        "throughput_rps": round(ok / elapsed, 2) if elapsed else 0.0,
        "all_replies_rps": round(len(every) / elapsed, 2) if elapsed else 0.0,
        "latency_all": latency_summary(every),
        "latency_ok": latency_summary([s for r in reports for s in r["ok_latencies"]]),
        "parity": {"compared": sum(r["compared"] for r in reports),
                   "max_abs_diff": worst(r["max_abs_diff"] for r in reports),
                   "decisions_changed": sum(r["decisions_changed"] for r in reports)},
        "daemon_counted": _counted(after) - _counted(before) - 1,   # less the `before` status call
        "batching": {"batches": batching["batches"] - before["batching"]["batches"],
                     "requests": batching["requests"] - before["batching"]["requests"],
                     "histogram": _difference(batching["batch_size_histogram"],
                                              before["batching"]["batch_size_histogram"])},
    }


def _difference(after: dict, before: dict) -> dict:
    return {k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0)}


def problems(report: dict) -> list[str]:
    """Everything that breaks 'load without loss'; empty when the run kept every promise."""
    found = []
    if report["missing"]:
        found.append(f"{len(report['missing'])} requests got no reply: {report['missing'][:5]}")
    if report["unexpected"]:
        found.append(f"{len(report['unexpected'])} replies for ids not in flight: {report['unexpected'][:5]}")
    if report["wrong"]:
        found.append(f"wrong outcomes: {report['wrong'][:5]}")
    if report["replies"] + report["abandoned"] != report["sent"]:
        found.append(f"sent {report['sent']}, replies {report['replies']} + abandoned {report['abandoned']}")
    if report["daemon_counted"] != report["sent"]:
        found.append(f"the daemon accounted for {report['daemon_counted']} messages, clients sent {report['sent']}")
    parity = report["parity"]
    if not parity["max_abs_diff"] <= MAX_DIFF or parity["decisions_changed"]:    # NaN fails too
        found.append(f"answers differ from serial scoring: {parity}")
    return found


def print_report(report: dict) -> None:
    print(f"{report['sent']} requests from {report['plan']['processes']} processes in {report['elapsed_s']}s: "
          f"{report['throughput_rps']} ok/s, {report['all_replies_rps']} replies/s")
    print(f"latency ok: {report['latency_ok']}; all: {report['latency_all']}")
    print(f"outcomes: {report['outcomes']}")
    print(f"abandoned by disconnecting clients: {report['abandoned']}; parity: {report['parity']}")
    print(f"batching: {report['batching']}")


def main(argv=None) -> int:
    from .harness import reference_answers, running_daemon, tiny_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = LoadPlan()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--max-batch-size", default="8")
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args(argv)
    plan = LoadPlan(**{k: getattr(args, k) for k in asdict(defaults)})
    model = tiny_model_dir()
    with running_daemon(model, "--max-batch-size", args.max_batch_size) as daemon:
        report = run_load(daemon.endpoint, plan, lambda bodies: reference_answers(model, bodies))
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
