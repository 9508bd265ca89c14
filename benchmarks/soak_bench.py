"""The long soak, loaded as production would load it: is the daemon as fast at the end as at the start?

    .venv/bin/python benchmarks/soak_bench.py --duration-s 1800 --out benchmarks/results/cpu-soak.json

One daemon (--max-batch-size 32 --http, the starter model in runs/starter, or
the tiny one with --tiny; one CPU worker) and, in processes of their own
(soak_load.py): 12 closed-loop ZeroMQ callers of mixed sizes (a tenth with
short deadlines, one in fifty malformed), 4 keep-alive HTTP callers (one
body in fifty invalid), and two churn callers, one per transport, each
sending a request and leaving without reading it, 20 a second. With
--reload-every-s the daemon is sent SIGHUP that often; with --long-states a
third of the closed-loop requests come from agent sessions (transcripts of
300-1,100 tokens, growing turn by turn), kept in and evicted from the prefix
cache. With --stall the last vCPU is held a share of the time for a while,
as a noisy host's hypervisor holds it (harness.stall_cpu).

Every --sample-s it reads, on the control endpoint, the workers' passes,
requests and busy seconds, the departed and late-withdrawn requests, the
replies dropped, the prefix cache, each worker's pace and its passes on
one thread and on all (engine/thread_policy.py); and from /proc,
for the supervisor, the gateway and each worker: RSS, descriptors, threads,
context switches and CPU seconds; and the host's CPU steal. A sample whose
ms per pass is more than twice the first two minutes' takes the worker's
stack with py-spy, where it is installed (at most MAX_STACKS).

It prints one line per --window-s window (ms per request and per pass, the
mean pass size, closed-loop p50 and p99, steal), then the figures the
targets are on: requests lost (every request a closed-loop caller sent
gets an answer or its typed error; lost is one with no reply in 60 s or a
broken HTTP connection), the worst window's ms per request and p99 over the
first two minutes', the share of scored requests whose caller had left,
and each process's RSS growth after --warmup-s. The JSON holds every sample
and window. The exit status is 1 if a request was lost. SIGTERM ends a run
early: its report covers what ran, and the daemon is stopped.
"""
import argparse
import multiprocessing as mp
import os
import queue
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import HERE, free_port, machine, percentile, project_env, stall_cpu, write_result
from jevany_client import JevClient
from soak_proc import ProcSampler, host_ticks, rss_growth
from soak_load import EXPECTED, REPLY_WITHIN_S, http_caller, http_churn, zmq_caller, zmq_churn

BASELINE_S = 120.0      # the first two minutes: what every later window is held against
MAX_STACKS = 10


def start_daemon(model: str, port: int, extra: list[str]) -> tuple[subprocess.Popen, Path]:
    rundir = Path(os.environ.get("TMPDIR", "/tmp")) / f"jv-soak-{os.getpid()}"
    rundir.mkdir(mode=0o700, exist_ok=True)
    env = project_env({**os.environ, "JEVANY_LOG_LEVEL": "WARNING"})
    argv = [sys.executable, "-m", "jevany_daemon", "serve", "--model", model, "--bind", f"ipc://{rundir}/d.sock",
            "--control", f"ipc://{rundir}/c.sock", "--http", f"127.0.0.1:{port}", "--max-batch-size", "32",
            "--device", "cpu", *extra]
    proc = subprocess.Popen(argv, env=env, stderr=open(rundir / "daemon.log", "wb"))
    with JevClient(f"ipc://{rundir}/d.sock", timeout=1, retries=0) as client:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the daemon exited while starting: {(rundir / 'daemon.log').read_text()[-2000:]}")
            try:
                if client.status()["state"] == "ready":
                    return proc, rundir
            except Exception:       # no socket yet, or loading: asked again
                pass
            time.sleep(0.25)       # polling a load, not standing in for a reply
    raise SystemExit("the daemon was not ready within 600 s")


def stack_of(pid: int) -> str:
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return "py-spy is not installed (pip install py-spy): no stack taken"
    done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    return (done.stdout or done.stderr)[-6000:]


def sample(control: JevClient, procs: ProcSampler, at: float, last_ticks) -> tuple[dict, tuple]:
    status = control.status()
    ticks = host_ticks()
    steal = (ticks[1] - last_ticks[1]) / max(1, ticks[0] - last_ticks[0])
    b, r = status["batching"], status["requests"]
    workers = [w for w in status["workers"] if w["role"] == "serving"]
    row = {"t_s": round(at, 1), "passes": b["batches"], "requests": b["requests"], "busy_s": b["busy_s"],
           "departed": r.get("departed", 0), "withdrawn_late": r.get("withdrawn_late", 0),
           "client_gone": status["clients"]["replies_dropped"].get("client gone", 0),
           "queue": status["queue"]["depth"], "steal": round(steal, 4),
           "prefix_cache": {k: status["prefix_cache"].get(k) for k in ("size", "bytes", "hits", "misses",
                                                                         "evictions")},
           "pace": {w["pid"]: w.get("pace") for w in workers},
           "collector": {w["pid"]: w.get("collector") for w in workers},
           "threads": {w["pid"]: (w.get("threads") or {}).get("passes") for w in workers},   # passes per count
           "procs": procs.read(status)}
    return row, ticks


def windows(samples: list[dict], replies: list[tuple], began: float, window_s: float) -> list[dict]:
    out = []
    edges = [s for s in samples if s["t_s"] % window_s < 1e-6 or s is samples[0]]
    for a, b in zip(edges, edges[1:]):
        passes, requests, busy = b["passes"] - a["passes"], b["requests"] - a["requests"], b["busy_s"] - a["busy_s"]
        lat = [sec for done, sec, kind, outcome in replies
               if a["t_s"] <= done - began < b["t_s"] and kind in ("decide", "http") and outcome in ("ok", "200")]
        steal = [s["steal"] for s in samples if a["t_s"] < s["t_s"] <= b["t_s"]]
        out.append({"from_s": a["t_s"], "to_s": b["t_s"], "passes": passes, "requests": requests,
                    "ms_per_request": round(busy * 1000 / requests, 2) if requests else None,
                    "ms_per_pass": round(busy * 1000 / passes, 2) if passes else None,
                    "pass_size": round(requests / passes, 2) if passes else None,
                    "p50_s": round(percentile(lat, 0.5), 3), "p99_s": round(percentile(lat, 0.99), 3),
                    "answered": len(lat), "queue": b["queue"], "steal": round(max(steal, default=0.0), 4)})
    return out


def summarize(args, samples, wins, replies, churn, stacks) -> dict:
    outcomes: dict = {}
    wrong = 0
    for _, _, kind, outcome in replies:
        if kind == "churn":
            continue
        outcomes[f"{kind}:{outcome}"] = outcomes.get(f"{kind}:{outcome}", 0) + 1
        wrong += outcome not in EXPECTED[kind]
    lost = sum(n for key, n in outcomes.items() if key.endswith(":lost") or ":connection" in key)
    base = [w for w in wins if w["to_s"] <= BASELINE_S and w["ms_per_request"]] or wins[:1]
    later = [w for w in wins if w["from_s"] >= BASELINE_S and w["ms_per_request"]]
    base_ms = percentile([w["ms_per_request"] for w in base], 0.5)
    base_p99 = max(w["p99_s"] for w in base) if base else 0.0
    first, last = samples[0], samples[-1]
    scored = last["requests"] - first["requests"]
    left = (last["client_gone"] - first["client_gone"]) + (last["withdrawn_late"] - first["withdrawn_late"])
    worst = max(later, key=lambda w: w["ms_per_request"], default=None)
    worst_p99 = max(later, key=lambda w: w["p99_s"], default=None)
    return {
        "lost": lost, "unexpected_outcomes": wrong, "outcomes": dict(sorted(outcomes.items())), "churn": churn,
        "baseline": {"ms_per_request": base_ms, "p99_s": base_p99},
        "worst_window": {"ms_per_request_ratio": round(worst["ms_per_request"] / base_ms, 2) if worst else None,
                         "at_s": worst and worst["from_s"],
                         "p99_ratio": round(worst_p99["p99_s"] / base_p99, 2) if worst_p99 and base_p99 else None,
                         "p99_at_s": worst_p99 and worst_p99["from_s"]},
        "scored": scored, "departed": last["departed"] - first["departed"],
        "scored_for_departed": left, "scored_for_departed_share": round(left / scored, 4) if scored else None,
        "rss_growth": rss_growth(samples, args.warmup_s),
        "stacks": stacks,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=1800.0)
    parser.add_argument("--warmup-s", type=float, default=300.0, help="RSS growth counts from here")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--zmq-callers", type=int, default=12)
    parser.add_argument("--http-callers", type=int, default=4)
    parser.add_argument("--no-churn", action="store_true", help="no callers that leave")
    parser.add_argument("--long-states", action="store_true",
                        help="a third of the closed-loop requests from agent sessions of 300-1,100 tokens "
                             "(the prefix cache in play)")
    parser.add_argument("--reload-every-s", type=float, default=0.0, help="SIGHUP the daemon this often (0: never)")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead of the starter")
    parser.add_argument("--serve-arg", action="append", default=[], help="one more argument for serve")
    parser.add_argument("--stall", type=float, default=0.0,
                        help="share of the last vCPU held from --stall-from-s to --stall-to-s, as a noisy host's "
                             "hypervisor holds it (harness.stall_cpu; root only; 0: never)")
    parser.add_argument("--stall-from-s", type=float, default=120.0)
    parser.add_argument("--stall-to-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "soak.json")
    args = parser.parse_args(argv)
    if args.window_s % args.sample_s:
        parser.error("--window-s must be a multiple of --sample-s")
    if args.stall and os.geteuid() != 0:
        parser.error("--stall needs root (a SCHED_FIFO process)")
    model = "tiny" if args.tiny else str(HERE.parent / "runs" / "starter")
    if not args.tiny and not Path(model).is_dir():
        parser.error(f"no starter model at {model}: make demo trains it (about a minute), or pass --tiny")
    if args.tiny:
        from jevany_daemon.model.tiny import build_tiny_model
        model = str(build_tiny_model(Path(os.environ.get("TMPDIR", "/tmp")) / f"jv-soak-tiny-{os.getpid()}",
                                     arch="qwen3", readout="choice", seed=0))
    port = free_port()
    daemon, rundir = start_daemon(model, port, args.serve_arg)
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    endpoint = f"ipc://{rundir}/d.sock"
    jobs = ([(zmq_caller, (endpoint, i, args.long_states)) for i in range(args.zmq_callers)]
            + [(http_caller, (port, i, args.long_states)) for i in range(args.http_callers)]
            + ([] if args.no_churn else [(zmq_churn, (endpoint,)), (http_churn, (port,))]))
    # daemon processes: ended with this one, however it ends
    callers = [ctx.Process(target=target, args=(*where, stop, out), daemon=True) for target, where in jobs]
    # SIGTERM (a timeout, an operator) ends the run early, reported as far as it went, the daemon stopped
    ended: list = []
    signal.signal(signal.SIGTERM, lambda *_: ended.append(True))
    replies, samples, stacks, churn = [], [], [], {}
    early_ms_per_pass: list = []     # each sample's in the first two minutes: what a stack is taken against
    control = JevClient(f"ipc://{rundir}/c.sock", timeout=30, retries=0)
    procs = ProcSampler(daemon.pid)
    stall = None        # the process holding a vCPU, while it runs

    def take(block_s: float) -> None:
        try:
            who, batch = out.get(timeout=block_s) if block_s else out.get_nowait()
        except queue.Empty:
            return
        if who.endswith("churn"):
            churn[who] = batch[-1][3]
        else:
            replies.extend(batch)

    try:
        for p in callers:
            p.start()
        began = time.monotonic()
        ticks = host_ticks()
        next_reload = began + args.reload_every_s if args.reload_every_s else None
        for k in range(int(args.duration_s / args.sample_s) + 1):
            due = began + k * args.sample_s
            while time.monotonic() < due and not ended:
                take(min(0.2, max(0.0, due - time.monotonic())))   # replies in, until the sample is due
            row, ticks = sample(control, procs, time.monotonic() - began, ticks)
            if not ended:
                row["t_s"] = round(k * args.sample_s, 1)    # on the sampling clock (a run cut short: as read)
            samples.append(row)
            # The latest sample's ms per pass against the first two minutes' median, taken once they are over.
            latest = windows(samples[-2:], [], began, args.sample_s)
            if latest and row["t_s"] <= BASELINE_S and latest[0]["ms_per_pass"]:
                early_ms_per_pass.append(latest[0]["ms_per_pass"])
            elif latest and early_ms_per_pass and len(stacks) < MAX_STACKS and latest[0]["ms_per_pass"] and (
                    latest[0]["ms_per_pass"] > 2 * percentile(early_ms_per_pass, 0.5)):
                pid = next(iter(row["pace"]), None)
                stacks.append({"t_s": row["t_s"], "ms_per_pass": latest[0]["ms_per_pass"],
                               "stack": stack_of(pid) if pid else "no serving worker"})
            if args.stall and stall is None and args.stall_from_s <= row["t_s"] < args.stall_to_s:
                stall = stall_cpu(args.stall)
            elif stall is not None and stall.returncode is None and row["t_s"] >= args.stall_to_s:
                stall.kill()
                stall.wait()
            if next_reload is not None and time.monotonic() >= next_reload:
                daemon.send_signal(signal.SIGHUP)
                next_reload += args.reload_every_s
            if ended:
                break
            if row["t_s"] % args.window_s == 0 and len(samples) > 1:
                [w] = windows(samples, replies, began, args.window_s)[-1:]
                print(f"{w['from_s']:6.0f}-{w['to_s']:<6.0f} {w['ms_per_request']} ms/request, "
                      f"{w['ms_per_pass']} ms/pass, size {w['pass_size']}, p50 {w['p50_s']} s, p99 {w['p99_s']} s, "
                      f"queue {w['queue']}, steal {w['steal']:.1%}", flush=True)
        stop.set()
        deadline = time.monotonic() + REPLY_WITHIN_S + 30
        while any(p.is_alive() for p in callers) and time.monotonic() < deadline:
            take(0.2)
        while not out.empty():
            take(0)
    finally:
        stop.set()
        if stall is not None:
            stall.kill()
        for p in callers:
            p.join(5)
            if p.is_alive():
                p.kill()
        control.close()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
    wins = windows(samples, replies, began, args.window_s)
    report = summarize(args, samples, wins, replies, churn, stacks)
    print(f"lost {report['lost']}, unexpected {report['unexpected_outcomes']}; worst window "
          f"{report['worst_window']}; scored for callers who had left {report['scored_for_departed']} of "
          f"{report['scored']} ({report['scored_for_departed_share']}), dropped unscored {report['departed']}; "
          f"RSS growth {report['rss_growth']}")
    write_result({"benchmark": "soak", "machine": machine(), "settings": vars(args) | {"out": str(args.out)},
                  "model": model, **report, "windows": wins, "samples": samples}, args.out)
    shutil.rmtree(rundir, ignore_errors=True)
    return 1 if report["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
