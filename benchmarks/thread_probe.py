"""One thread or all of them for a CPU pass: what waking the other threads costs, and the thread policy.

    python benchmarks/thread_probe.py                  # the starter model (runs/starter), else the tiny one
    python benchmarks/thread_probe.py --stall 0.5      # one vCPU held half the time (root: SCHED_FIFO)

In this process, under a worker's settings (harness.like_a_worker: OpenMP's
threads wait passively), for passes of several shapes (short requests 1, 3,
8 and 32 at a time, 8 mixed, 4 long; the prefix cache cleared before each
pass, so every pass computes its tokens):
- ms per pass on one thread and on all of them (--threads, by default the
  cores), the two alternating round by round;
- wake-ups per pass: voluntary context switches of the process's other
  threads. OpenMP's threads sleep on a futex between parallel regions, so
  each is a region that woke one; the count on one thread (other threads'
  own, such as the tokenizer's) is taken off;
- what a wake-up costs: (all - one) / wake-ups;
- then the engine over all the shapes in turn, its thread policy fixed on
  all threads and adaptive (engine/thread_policy.py), alternating.

--stall D stands for a hypervisor that leaves the last vCPU unrun for a
share D of the time (harness.stall_cpu: a SCHED_FIFO process pinned to it
runs D of every 4 ms; root only). The guest still sees that vCPU's threads
and moves them when another CPU idles; a truly stalled vCPU holds the
thread it was running, so this is the mild form.

Writes benchmarks/results/cpu-thread-probe.json (--out).
"""
import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from harness import STALL_PERIOD_S, like_a_worker, machine, stall_cpu, worker_env_in_effect, write_result

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "client")]


def shapes() -> dict[str, list]:
    from jevany_daemon import workloads

    return {"short 1": workloads.short(1, seed=3), "short 3": workloads.short(3, seed=7),
            "short 8": workloads.short(8, seed=5), "short 32": workloads.short(32, seed=9),
            "mixed 8": workloads.mixed(8, seed=2), "long 4": workloads.long_uneven(4, seed=1)}


def voluntary_switches(skip: int) -> int:
    """Voluntary context switches of this process's threads but `skip` (the main one), in all."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == skip:
            continue
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (FileNotFoundError, StopIteration):
            pass        # a thread that ended meanwhile
    return total


def timed_passes(engine, bodies, seconds: float) -> tuple[float, float]:
    """(median ms a pass, wake-ups a pass) of passes of `bodies`, for at least `seconds` and 3 passes."""
    main = threading.get_native_id()
    walls, began, woke = [], time.perf_counter(), voluntary_switches(main)
    while time.perf_counter() - began < seconds or len(walls) < 3:
        engine.clear_prefix_cache()
        t = time.perf_counter()
        engine.score(engine.admit_many(bodies))
        walls.append((time.perf_counter() - t) * 1000)
    return statistics.median(walls), (voluntary_switches(main) - woke) / len(walls)


def probe_shapes(engine, most: int, rounds: int, seconds: float) -> dict:
    import torch

    out = {}
    for name, bodies in shapes().items():
        one, every, woke_one, woke_all = [], [], [], []
        engine.score(engine.admit_many(bodies))     # its shapes met once before timing
        for _ in range(rounds):
            for threads, walls, woken in ((1, one, woke_one), (most, every, woke_all)):
                torch.set_num_threads(threads)
                ms, woke = timed_passes(engine, bodies, seconds)
                walls.append(ms)
                woken.append(woke)
        torch.set_num_threads(most)
        one_ms, all_ms = statistics.median(one), statistics.median(every)
        wakeups = statistics.median(woke_all) - statistics.median(woke_one)
        out[name] = {"requests": len(bodies), "one_thread_ms": round(one_ms, 2), "all_threads_ms": round(all_ms, 2),
                     "all_over_one": round(all_ms / one_ms, 2), "wakeups_per_pass": round(wakeups, 1),
                     "us_per_wakeup": round((all_ms - one_ms) * 1000 / wakeups, 1) if wakeups > 0 else None}
        print(f"{name:>9}: one thread {one_ms:7.2f} ms, {most} threads {all_ms:7.2f} ms ({all_ms / one_ms:.2f}x), "
              f"{wakeups:6.1f} wake-ups a pass", flush=True)
    return out


def probe_policies(engines: dict, rounds: int) -> dict:
    """ms for every shape once, in turn, per policy; the policies alternate round by round."""
    every = list(shapes().values())
    for engine in engines.values():     # the adaptive engine measures each class both ways before it is timed
        for _ in range(2):
            for bodies in every:
                engine.score(engine.admit_many(bodies))
    totals = {name: [] for name in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            t = time.perf_counter()
            for bodies in every:
                engine.clear_prefix_cache()
                engine.score(engine.admit_many(bodies))
            totals[name].append((time.perf_counter() - t) * 1000)
    out = {name: {"ms_per_round_p50": round(statistics.median(ms), 1),
                  "threads": engines[name].threads.as_dict()} for name, ms in totals.items()}
    ratio = out["fixed"]["ms_per_round_p50"] / out["adaptive"]["ms_per_round_p50"]
    print(f"every shape in turn: fixed {out['fixed']['ms_per_round_p50']} ms, adaptive "
          f"{out['adaptive']['ms_per_round_p50']} ms ({ratio:.2f}x)", flush=True)
    return out | {"fixed_over_adaptive": round(ratio, 2)}


def main() -> int:
    like_a_worker()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "runs" / "starter")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead of the starter")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="of passes per shape, setting and round")
    parser.add_argument("--policy-rounds", type=int, default=9, help="of every shape in turn, per policy")
    parser.add_argument("--stall", type=float, default=0.0, help="share of the last vCPU held (0: none)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "cpu-thread-probe.json")
    args = parser.parse_args()
    if args.threads < 2:
        raise SystemExit("--threads must be at least 2: one thread is what it is compared with")

    import tempfile

    import torch

    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine
    from jevany_daemon.model.loading import load_model
    from jevany_daemon.model.tiny import build_tiny_model

    torch.set_num_threads(args.threads)
    source = args.model
    if args.tiny or not (source / "head.pt").exists():
        source = build_tiny_model(Path(tempfile.mkdtemp()), arch="qwen3", readout="choice")
    model = load_model(str(source), device="cpu", dtype="fp32")
    engines = {policy: Engine(model, EngineConfig(max_batch_size=32, thread_policy=policy))
               for policy in ("fixed", "adaptive")}
    stall = stall_cpu(args.stall) if args.stall > 0 else None
    try:
        by_shape = probe_shapes(engines["fixed"], args.threads, args.rounds, args.seconds)
        policies = probe_policies(engines, args.policy_rounds)
    finally:
        if stall is not None:
            stall.kill()
    write_result({"benchmark": "thread_probe", "machine": machine(), "model": str(source),
                  "settings": {"threads": args.threads, "rounds": args.rounds, "seconds": args.seconds,
                               "policy_rounds": args.policy_rounds,
                               "stall": args.stall, "stall_period_s": STALL_PERIOD_S},
                  "worker_env": worker_env_in_effect(), "shapes": by_shape, "policies": policies}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
