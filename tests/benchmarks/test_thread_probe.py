"""CI runs thread_probe.py's short form on the tiny model: every shape measured on one thread and on two,
the wake-ups two threads cost counted, and both thread policies run; never its timings."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_thread_probe_counts_the_wake_ups_of_passes_on_two_threads(tmp_path):
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "thread_probe.py"), "--tiny", "--threads", "2",
                           "--rounds", "1", "--seconds", "0.01", "--policy-rounds", "1",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT / "benchmarks")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["worker_env"]["OMP_WAIT_POLICY"] == "PASSIVE"          # measured as a worker runs
    shapes = report["shapes"]
    assert set(shapes) == {"short 1", "short 3", "short 8", "short 32", "mixed 8", "long 4"}
    assert all(s["one_thread_ms"] > 0 and s["all_threads_ms"] > 0 for s in shapes.values())
    # OpenMP's other thread sleeps after every region of a pass on two threads, and a pass has many
    assert shapes["short 32"]["wakeups_per_pass"] > 10
    policies = report["policies"]
    assert policies["fixed"]["threads"]["passes"] == {"2": policies["fixed"]["threads"]["passes"]["2"]}
    assert policies["adaptive"]["threads"]["adaptive"] and not policies["fixed"]["threads"]["adaptive"]
