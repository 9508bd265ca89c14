"""OpenMP's wait policy on a shared CPU: why workers wait passively (runs that fall off a cliff).

    python benchmarks/omp_wait.py                 # 4 busy processes, 2 rounds of each policy
    python benchmarks/omp_wait.py --busy 0        # the same on free cores

A worker scores with 2 torch threads while client processes run on the same
cores. libgomp's threads spin after each parallel region before they sleep
(its default wait policy); a spinning thread holds a core the next region, or
a client, needs. Each round runs the same passes (8 uneven requests, tiny
Qwen3, choice readout, prefix cache off) in a fresh process per policy, the
policy set before torch loads, beside --busy processes that compute 2 ms and
sleep 1 ms as a closed-loop client does; the policies alternate, so the
machine's own noise falls on both. Reported per policy: the median and the
worst pass, wall and CPU time of the scoring process.

Writes benchmarks/results/omp-wait.json (--out).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from harness import alternating, machine, project_env, write_result

HERE = Path(__file__).resolve().parent

# One measurement, in a process of its own (OMP_WAIT_POLICY is read once, as torch loads).
CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
import torch
torch.set_num_threads(2)
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model
passes = int(sys.argv[1])
model = load_model(str(build_tiny_model(Path(tempfile.mkdtemp()), arch="qwen3", readout="choice")))
engine = Engine(model, EngineConfig(max_batch_size=32, batch_policy="greedy", max_padding_waste=1.0,
                                    prefix_cache=0))
bodies = workloads.long_uneven(8, seed=3)
engine.score([engine.admit(b) for b in bodies])
print("ready", flush=True)
sys.stdin.readline()            # the busy processes are running
out = []
for _ in range(passes):
    wall, cpu = time.perf_counter(), time.process_time()
    engine.score([engine.admit(b) for b in bodies])
    out.append([(time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000])
print(json.dumps(out), flush=True)
"""
BUSY = "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.002: pass\n" \
       "    time.sleep(0.001)\n"


def measure(policy: str, busy: int, passes: int) -> list[list[float]]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(passes)], env=project_env(env), text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    hogs = []
    try:
        assert child.stdout.readline().strip() == "ready"
        hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
        child.stdin.write("go\n")
        child.stdin.flush()
        return json.loads(child.stdout.readline())
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        child.kill()
        child.wait()


def summary(samples: list[list[float]]) -> dict:
    wall, cpu = [s[0] for s in samples], [s[1] for s in samples]
    return {"passes": len(samples), "wall_p50_ms": round(statistics.median(wall), 1), "wall_max_ms": round(max(wall), 1),
            "cpu_p50_ms": round(statistics.median(cpu), 1), "cpu_max_ms": round(max(cpu), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=4, help="busy processes beside the scoring one")
    parser.add_argument("--passes", type=int, default=10, help="timed passes per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "omp-wait.json")
    args = parser.parse_args()
    rounds = alternating(["default", "PASSIVE"], args.rounds, lambda policy: measure(policy, args.busy, args.passes))
    results = {policy: summary([s for r in runs for s in r]) for policy, runs in rounds.items()}
    ratio = {k: round(results["default"][k] / results["PASSIVE"][k], 2) for k in ("wall_p50_ms", "cpu_p50_ms")}
    report = {"machine": machine(), "busy": args.busy, "torch_threads": 2, "results": results, "default_over_passive": ratio}
    for policy, r in results.items():
        print(f"{policy:8s} wall p50 {r['wall_p50_ms']:8.1f} ms  max {r['wall_max_ms']:8.1f}   "
              f"cpu p50 {r['cpu_p50_ms']:8.1f} ms  max {r['cpu_max_ms']:8.1f}")
    print(f"default / passive: wall {ratio['wall_p50_ms']}x, cpu {ratio['cpu_p50_ms']}x")
    write_result(report, args.out)


if __name__ == "__main__":
    main()
