"""glibc's malloc thresholds in a worker: why workers keep their passes' memory (host time per pass).

    python benchmarks/malloc_tuning.py              # 2 rounds of each setting, 15 hand-overs each
    python benchmarks/malloc_tuning.py --rounds 1 --passes 5

glibc returns a freed block over its mmap threshold to the OS at once and
trims its heap's free top past its trim threshold, so the megabytes a pass
allocates (masks, inputs, activations) are mapped and zero-filled again by
the next: page faults, in the kernel, on the host's time. Each round scores
the same hand-over (32 short requests, tiny Qwen3, choice readout, the
engine's defaults up to 32 requests a pass, one torch thread) in a fresh
process per setting, glibc's defaults or the worker's (server/worker_handle.py
MALLOC_DEFAULTS), set before the process starts; the settings alternate, so
the machine's noise falls on both. Reported per setting: the median
hand-over's wall, CPU and kernel ms, its minor page faults, and the
process's peak resident memory (the tuned worker keeps what its passes
used).

Writes benchmarks/results/malloc-tuning.json (--out).
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
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "client")]

from jevany_daemon.server.worker_handle import MALLOC_DEFAULTS, malloc_settings  # noqa: E402

# One measurement, in a process of its own (glibc reads its settings once, as the process starts).
CHILD = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model
passes = int(sys.argv[1])
model = load_model(str(build_tiny_model(Path(tempfile.mkdtemp()), arch="qwen3", readout="choice")))
engine = Engine(model, EngineConfig(max_batch_size=32))
bodies = workloads.short(32, seed=7)
for _ in range(2):
    engine.score(engine.admit_many(bodies))
out = []
for _ in range(passes):
    engine.clear_prefix_cache()
    before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    engine.score(engine.admit_many(bodies))
    wall, after = time.perf_counter() - wall, resource.getrusage(resource.RUSAGE_SELF)
    out.append([wall * 1000, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000,
                (after.ru_stime - before.ru_stime) * 1000, after.ru_minflt - before.ru_minflt])
print(json.dumps({"passes": out, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(setting: str, passes: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    if setting == "worker":
        env.update(malloc_settings(env))
    done = subprocess.run([sys.executable, "-c", CHILD, str(passes)], env=project_env(env), text=True, capture_output=True,
                          check=True, timeout=900)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    samples = [p for r in runs for p in r["passes"]]
    column = lambda i: statistics.median(s[i] for s in samples)
    return {"hand_overs": len(samples), "wall_p50_ms": round(column(0), 1), "cpu_p50_ms": round(column(1), 1),
            "kernel_p50_ms": round(column(2), 1), "page_faults_p50": int(column(3)),
            "max_rss_mb": round(max(r["max_rss_mb"] for r in runs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=15, help="timed hand-overs per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "malloc-tuning.json")
    args = parser.parse_args()
    runs = alternating(["glibc", "worker"], args.rounds, lambda setting: measure(setting, args.passes))
    results = {setting: summary(r) for setting, r in runs.items()}
    ratio = {k: round(results["glibc"][k] / results["worker"][k], 2) for k in ("wall_p50_ms", "cpu_p50_ms")}
    report = {"machine": machine(), "torch_threads": 1, "requests": 32, "worker_settings": MALLOC_DEFAULTS,
              "results": results, "glibc_over_worker": ratio}
    for setting, r in results.items():
        print(f"{setting:6s} wall p50 {r['wall_p50_ms']:7.1f} ms  cpu {r['cpu_p50_ms']:7.1f} ms  "
              f"kernel {r['kernel_p50_ms']:6.1f} ms  faults {r['page_faults_p50']:6d}  peak rss {r['max_rss_mb']} MB")
    print(f"glibc / worker: wall {ratio['wall_p50_ms']}x, cpu {ratio['cpu_p50_ms']}x")
    write_result(report, args.out)


if __name__ == "__main__":
    main()
