"""CI runs the GPU check on the CPU, small (scripts/gpu-check --cpu --shape tiny), so it never rots."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
                           "--clients", "4", "--rounds", "1", "--idle-requests", "4", "--busy-passes", "1",
                           "--out", str(out)],
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


def test_busy_for_both_dtypes_and_every_variant(check):
    for dtype in ("fp32", "bf16"):
        busy = check["dtypes"][dtype]["busy"]
        assert set(busy) == {"as_served", "with_cudnn_attention", "delta_rule_on_torch"}
        for cases in busy.values():
            assert cases["batched"]["requests_per_pass"] == 32 and cases["single"]["requests_per_pass"] == 1
            assert cases["batched"]["passes"] == 1 and cases["single"]["passes"] == 4
            for r in cases.values():
                assert r["wall_ms"] > 0 and r["forwards_per_pass"] >= 1
                # no device timeline on the CPU: nothing is made up in its place
                assert r["busy_ms"] is r["busy_fraction"] is r["device_ops_per_pass"] is None
                assert "top_device_ops" not in r
                # CPU builds of torch come without Triton: no tuning counted, none invented
                assert r["autotune_benchmarks_per_pass"] is r["autotuned_kernels"] is None
                # the host's ops are listed, most time first
                ops = list(r["top_host_ops"].values())
                assert 0 < len(ops) <= 15 and all(o["ms"] >= 0 and o["calls"] > 0 for o in ops)
                assert [o["ms"] for o in ops] == sorted((o["ms"] for o in ops), reverse=True)


def test_the_invariant_phase_counts_bit_identical_answers_for_both_dtypes(check):
    for dtype in ("fp32", "bf16"):
        phase = check["dtypes"][dtype]["invariant"]
        assert phase["invariant"]["requests"] == phase["today"]["requests"] == 2
        assert phase["invariant"]["bit_identical"] == 2       # what the setting promises, on this CPU
        assert 0 <= phase["today"]["bit_identical"] <= 2
        assert phase["invariant"]["rps"] > 0 and phase["today"]["rps"] > 0
        assert phase["invariant_over_today"] == phase["invariant"]["rps"] / phase["today"]["rps"]


def test_graphs_for_both_dtypes_and_its_daemons_in_bf16(check):
    for dtype in ("fp32", "bf16"):
        graphs = check["dtypes"][dtype]["graphs"]
        warm = graphs["warm"]
        # On a CPU the plan runs eagerly where CUDA would capture: nothing captured, nothing made up
        assert warm["buckets"] > 10 and warm["captured"] == 0 and warm["pool_mib"] == 0.0
        assert warm["phases_s"]["first_runs"] > 0 and warm["autotune_benchmarks"] is None
        parity = graphs["parity"]
        assert parity["errors"] == 0 and parity["non_finite"] == {"graphs": 0, "as_they_come": 0}
        assert parity["plan"]["planned"] > 0 and parity["plan"]["eager"] == {}
        if dtype == "fp32":
            assert parity["max_abs_diff"] <= 1e-5 and parity["decisions_changed"] == 0
        for engine in ("graphs", "as_they_come"):
            cases = graphs["passes"][engine]
            assert cases["batched"]["requests_per_pass"] == 32 and cases["single"]["requests_per_pass"] == 1
            assert all(r["wall_ms"] > 0 for r in cases.values())
        for n in ("32", "64", "128"):
            row = graphs["throughput"][n]
            assert row["graphs"] > 0 and row["as_they_come"] > 0
        assert graphs["plan_counts"]["recompiles"] == 0
    daemons = check["dtypes"]["bf16"]["graphs"]["daemons"]
    assert set(daemons["rps_rounds"]) == {"graphs-bf16-batch32", "graphs-bf16-batch1"}
    assert all(rps > 0 for rounds in daemons["rps_rounds"].values() for rps in rounds)
    for plan in daemons["plan"].values():     # on a CPU the daemons run the plan eagerly
        assert plan["runner"] == "eager" and plan["planned"] > 0
    assert "daemons" not in check["dtypes"]["fp32"]["graphs"]
    judged = {t["target"]: t for t in check["targets"]}
    assert judged["graphs fp32: max |dp| against passes as they come"]["met"]
    assert judged["graphs bf16: a pass of one, wall ms"]["judged"] is False


def test_autotuning_is_counted_by_kernel_and_the_autotuner_restored(monkeypatch):
    """Triton is not on a CPU build, so a module of its shape stands in: what is under test is the
    busy phase's counting (every config timed, by kernel name) and that the autotuner is left as found."""
    import types

    class Autotuner:
        def __init__(self, name):
            self.base_fn = types.SimpleNamespace(__name__=name)

        def _bench(self, *args, config, **meta):
            return [float(config)]

    module = types.ModuleType("triton.runtime.autotuner")
    module.Autotuner = Autotuner
    for name in ("triton", "triton.runtime"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "triton.runtime.autotuner", module)
    served = Autotuner._bench
    cumsum, kkt = Autotuner("chunk_local_cumsum_scalar_kernel"), Autotuner("kkt")
    with _benchmark("gpu_busy").autotuning_counted() as counts:
        timings = [cumsum._bench(config=c) for c in (1, 2, 4, 8)] + [kkt._bench(config=3)]
    assert timings == [[1.0], [2.0], [4.0], [8.0], [3.0]]        # the real benchmark still ran
    assert counts == {"chunk_local_cumsum_scalar_kernel": 4, "kkt": 1}
    assert Autotuner._bench is served
    cumsum._bench(config=1)
    assert sum(counts.values()) == 5                                  # nothing counted outside


def test_the_sdpa_probe_runs_at_the_models_head_size():
    """0.8b's attention heads (8 of 256) reach the probe; the kernel can depend on them."""
    rows = _benchmark("sdpa_probe").probe("cpu", shape=(2, 8, 16, 256))
    assert len(rows) == 6 and all(r["kernel"] and r["torch_default"] for r in rows)


def test_the_sdpa_probe_asks_under_the_engines_settings_and_restores_torchs():
    """On CUDA the engine leaves cuDNN's attention out; the probe asks what serves then, and leaves the
    process as it found it (flags only: no CUDA needed to set them)."""
    import torch

    as_served = _benchmark("sdpa_probe").as_served
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        with as_served("cuda"):
            assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.cudnn_sdp_enabled()
        with as_served("cpu"):
            assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_phases_and_dtypes_run_alone(tmp_path):
    """--phases busy --dtypes bf16: only that, no daemon started, and its figures written."""
    out = tmp_path / "busy.json"
    proc = subprocess.run([str(SCRIPT), "--cpu", "--shape", "tiny", "--phases", "busy", "--dtypes", "bf16",
                           "--busy-passes", "1", "--busy-tune-rows", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["settings"]["phases"] == ["busy"] and result["settings"]["dtypes"] == ["bf16"]
    assert "parity" not in result and list(result["dtypes"]) == ["bf16"]
    assert sorted(result["dtypes"]["bf16"]) == ["busy", "busy_rows_tuned"]
    tuned = result["dtypes"]["bf16"]["busy_rows_tuned"]
    assert tuned["rows"] == 3 and tuned["seconds"] > 0 and tuned["autotune_benchmarks"] is None   # no Triton
    # the row counts the delta rule met are listed, so a sweep can be sized to them
    for cases in result["dtypes"]["bf16"]["busy"].values():
        assert cases["single"]["delta_rule_rows"] and cases["batched"]["delta_rule_rows"]
        assert all(n >= 1 for c in cases.values() for n in c["delta_rule_rows"])
    assert "start daemons and clients" not in result["phase_s"]
    assert result["sdpa"] and result["targets"] == [] and result["passed"] is True


def _benchmark(name: str):
    """A module of benchmarks/ (not a package: scripts import each other by name, so benchmarks/ is put
    on the path as running one of them does)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("intervals, expected", [
    ([], 0.0),
    ([(0, 2)], 2.0),
    ([(0, 2), (1, 3)], 3.0),                  # overlapping: counted once
    ([(5, 6), (0, 2), (5.5, 5.7)], 3.0),      # unsorted, one inside another
    ([(0, 1), (1, 2)], 2.0),                  # touching
    ([(0, 10), (2, 3), (4, 12)], 12.0),
])
def test_device_busy_is_the_union_of_kernel_intervals(intervals, expected):
    assert _benchmark("gpu_busy").union_us(intervals) == expected


def test_top_ops_are_per_pass_and_by_time():
    timed = [("a", 1000.0), ("b", 3000.0), ("a", 1000.0), ("c", 500.0)]
    assert _benchmark("gpu_busy").top(timed, passes=2, keep=2) == {"b": {"ms": 1.5, "calls": 0.5},
                                                                   "a": {"ms": 1.0, "calls": 1.0}}


def test_speed_targets_not_judged_on_cpu(check):
    by_name = {t["target"]: t for t in check["targets"]}
    speed = {name for name in by_name if "throughput" in name or name.startswith(("graphs bf16: a pass",
                                                                                  "graphs bf16: batched"))}
    assert len(speed) == 4 and all(not by_name[n]["judged"] and by_name[n]["met"] is None for n in speed)
    assert all(t["judged"] and t["met"] for name, t in by_name.items() if name not in speed)


def test_cuda_requested_but_unavailable_exits_2(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = subprocess.run([str(SCRIPT), "--shape", "tiny", "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "CUDA is not available" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_the_delta_rule_on_torch_swaps_and_restores(tmp_path):
    """The busy phase's third variant: for its duration the prefill delta rule runs transformers'
    PyTorch code (the function under what serves it), never what serves it; afterwards what
    served it before is back."""
    import inspect

    from jevany_daemon import workloads
    from jevany_daemon.engine.engine import Engine
    from jevany_daemon.model import kernels
    from jevany_daemon.model.loading import load_model
    from jevany_daemon.model.tiny import build_tiny_model

    busy = _benchmark("gpu_busy")
    model = load_model(str(build_tiny_model(tmp_path / "m", arch="qwen3_5")), device="cpu")
    module = kernels.modeling_module(model.causal_lm)
    original = getattr(module, kernels.PREFILL_RULE)
    reference, calls = inspect.unwrap(original), []

    def counted(*args, **kwargs):
        calls.append(1)
        return reference(*args, **kwargs)

    def served(*args, **kwargs):        # stands in for fla's kernel: must not run in the variant
        raise AssertionError("the served kernel ran")

    counted.__signature__ = inspect.signature(reference)
    served.__wrapped__ = counted
    bodies = workloads.mixed(4, seed=3, max_words=20)
    first = Engine(model)
    before = [first.score([first.admit(b)])[0]["answers"] for b in bodies]
    setattr(module, kernels.PREFILL_RULE, served)
    try:
        with busy.delta_rule_on_torch(model.causal_lm):
            engine = Engine(model)
            during = [engine.score([engine.admit(b)])[0]["answers"] for b in bodies]
            # rows packed end to end would be mixed by the reference: refused, not run
            with pytest.raises(ValueError, match="packed sequences"):
                getattr(module, kernels.PREFILL_RULE)(None, None, None, cu_seqlens=[0, 3])
        assert getattr(module, kernels.PREFILL_RULE) is served
    finally:
        setattr(module, kernels.PREFILL_RULE, original)
    assert calls and during == before


def test_the_row_sweep_calls_the_served_delta_rule_once_for_every_row_count(tmp_path):
    """--busy-tune-rows: rows 1..N each meet the served prefill rule once, as the layers call it (its
    output is the reference's own shape), and the rule is left as it was."""
    from jevany_daemon.model import kernels
    from jevany_daemon.model.loading import load_model
    from jevany_daemon.model.tiny import build_tiny_model

    busy = _benchmark("gpu_busy")
    model = load_model(str(build_tiny_model(tmp_path / "m", arch="qwen3_5")), device="cpu", dtype="bf16")
    module = kernels.modeling_module(model.causal_lm)
    served, calls = getattr(module, kernels.PREFILL_RULE), []

    def watched(query, *args, **kwargs):
        out, state = served(query, *args, **kwargs)
        calls.append((query.shape[0], query.dtype, tuple(out.shape[:2]), state is not None))
        return out, state

    setattr(module, kernels.PREFILL_RULE, watched)
    try:
        with busy.rows_seen(model.causal_lm) as seen:
            tuned = busy.tune_rows(model, 5, "cpu")
        assert getattr(module, kernels.PREFILL_RULE) is watched
    finally:
        setattr(module, kernels.PREFILL_RULE, served)
    assert seen == {1, 2, 3, 4, 5}
    assert calls == [(b, torch.bfloat16, (b, busy.TUNING_WIDTH), True) for b in range(1, 6)]
    assert tuned["rows"] == 5 and tuned["seconds"] > 0


def test_the_speed_phase_warms_up_on_requests_it_does_not_measure():
    """On a GPU a shape met before is cheaper; warmed on the idle requests themselves, the serial daemon
    met them at idle in exactly their shapes (an H200's idle p50, 2026-12-04: 53.8 ms against 71.1 in-process)."""
    check = _benchmark("gpu_check")
    for argv in (["--cpu", "--shape", "tiny"], []):
        args = check.parse_args(argv)
        warm, measured = check.warm_up_requests(args), check.measured_requests(args)
        assert len(warm) == 2 * args.clients and len(measured) == args.requests
        assert not {json.dumps(b, sort_keys=True) for b in warm} & {json.dumps(b, sort_keys=True) for b in measured}
