"""CI runs the GPU check on the CPU, small (scripts/gpu-check --cpu --shape tiny), so it never rots."""
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check"
READOUTS = ("choice", "pointer", "lm_token")
# Each layout with the prefix cache off, and the cached path as a case of its own.
LAYOUTS = {"qwen3_5": ("rows", "shared", "cached"), "qwen3": ("packed", "cached")}
CASES = {(arch, readout, layout, dtype) for arch, layouts in LAYOUTS.items() for readout in READOUTS
         for layout in layouts for dtype in ("fp32", "bf16")}


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    """One run for the whole module, smaller than --cpu's defaults: every case and table, few requests each
    (the suite's time is bounded; the figures are not judged on a CPU)."""
    out = tmp_path_factory.mktemp("gpu-check") / "check.json"
    proc = subprocess.run([str(SCRIPT), "--cpu", "--shape", "tiny", "--parity-n", "2", "--requests", "8",
                           "--clients", "4", "--rounds", "1", "--idle-requests", "4", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_runs_clean(check):
    assert check["error"] is None and check["passed"] is True
    assert check["machine"]["device"] == "cpu" and check["machine"]["torch"]


def test_every_parity_case(check):
    cases = [(r["arch"], r["readout"], r["layout"], r["dtype"]) for r in check["parity"]]
    assert set(cases) == CASES and len(cases) == len(CASES) == 30
    for r in check["parity"]:
        assert r["errors"] == 0, r
        assert r["batched_mean_batch_size"] > 1, r      # the batched run really shared passes
        assert r["probabilities"] > 0
        if r["layout"] == "cached":                     # the prefix cache served it, and was hit
            assert r["path"] == "reuse" and r["prefix_cache"] and r["cache_hits"] > 0, r
        else:                                           # the layout itself served it, cache off
            assert r["path"] == r["layout"] and not r["prefix_cache"], r


def test_the_sdpa_kernel_and_its_row_without_a_key_are_recorded(check):
    kinds = {(r["dtype"], r["mask"]) for r in check["sdpa"]}
    assert kinds == {(d, m) for d in ("float32", "bfloat16")
                     for m in ("none (causal)", "additive float 4D", "boolean 4D")}
    for r in check["sdpa"]:
        assert r["kernel"] and r["row_without_a_key"] in (("n/a",) if r["mask"].startswith("none")
                                                          else ("nan", "zeros", "finite")), r


def test_fp32_parity(check):
    for r in (r for r in check["parity"] if r["dtype"] == "fp32"):
        assert r["max_abs_diff"] <= 1e-5, r
        assert r["decisions_changed"] == 0, r


def test_every_probability_finite(check):
    for r in check["parity"]:
        assert r["non_finite"] == 0, r
        assert r["checked_finite"] == 2 * r["probabilities"], r     # both runs, every probability


def test_throughput_and_idle_for_both_dtypes(check):
    for dtype in ("fp32", "bf16"):
        speed, idle = check["dtypes"][dtype]["speed"], check["dtypes"][dtype]["idle"]
        for run in (speed["serial"], speed["batched"]):
            assert run["rps"] > 0 and run["p50_ms"] > 0 and run["p99_ms"] >= run["p50_ms"]
        assert speed["batched"]["max_batch_size"] == 32 and speed["serial"]["max_batch_size"] == 1
        assert speed["batched_over_serial"] > 0
        assert idle["inprocess_p50_ms"] > 0 and idle["daemon_p50_ms"] > 0
        workers = [w for ws in check["dtypes"][dtype]["memory"]["workers"].values() for w in ws]
        assert len(workers) == 2 and all(w["memory_total_bytes"] > w["memory_peak_bytes"] > 0 for w in workers)


def test_speed_targets_not_judged_on_cpu(check):
    by_name = {t["target"]: t for t in check["targets"]}
    speed = [t for name, t in by_name.items() if "throughput" in name]
    assert len(speed) == 2 and all(not t["judged"] and t["met"] is None for t in speed)
    assert all(t["judged"] and t["met"] for name, t in by_name.items() if "throughput" not in name)


def test_cuda_requested_but_unavailable_exits_2(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = subprocess.run([str(SCRIPT), "--shape", "tiny", "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "CUDA is not available" in proc.stderr
    assert not (tmp_path / "x.json").exists()
