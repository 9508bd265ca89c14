"""gpu-check's targets and report: each target judged on the result, and the lines printed for a person.

Targets: fp32 parity max |dp| <= 1e-5 and no decision changed, every probability
finite, no parity request failed; the daemons counted no non-finite pass (where
status reports it); on a GPU, batched / serial throughput >= 3x in fp32 and
>= 6x in bf16 (on the CPU recorded, not judged). The graphs phase: fp32 parity
graphs vs passes as they come <= 1e-5, no non-finite probability; on a GPU no
autotuning in served graph passes, a bf16 pass of one <= 8 ms, and the bf16
batched graphs daemon >= 1000 req/s in every round, the first included.
"""
import math

PARITY_FP32_BOUND = 1e-5
SPEED_BOUNDS = {"fp32": 3.0, "bf16": 6.0}
GRAPH_PASS_OF_ONE_MS = 8.0        # bf16, 0.8B shape, H200
GRAPH_DAEMON_RPS = 1000.0         # bf16, 32 clients, every round


def judge(result: dict) -> list[dict]:
    on_gpu = result["machine"]["device"] == "cuda"
    parity = result.get("parity", [])
    fp32 = [r for r in parity if r["dtype"] == "fp32"]
    out = []

    def add(name, value, bound, met, judged=True):
        out.append({"target": name, "value": value, "bound": bound, "judged": judged,
                    "met": bool(met) if judged else None})

    if parity:
        diffs = [r["max_abs_diff"] for r in fp32]     # max() would keep a NaN only if it came first
        worst = math.nan if any(map(math.isnan, diffs)) else max(diffs, default=0.0)
        add("parity fp32: max |dp| batched vs serial", worst, f"<= {PARITY_FP32_BOUND:g}",
            worst <= PARITY_FP32_BOUND)
        add("parity fp32: decisions changed", sum(r["decisions_changed"] for r in fp32), "== 0",
            all(r["decisions_changed"] == 0 for r in fp32))
        bad = sum(r["non_finite"] for r in parity)
        add("every probability finite (fp32 and bf16, batched and serial)", bad, "== 0 non-finite", bad == 0)
        errors = sum(r["errors"] + r["mismatched"] for r in parity)
        add("no parity request failed or answered other questions", errors, "== 0", errors == 0)
    speeds = {dtype: p["speed"] for dtype, p in result.get("dtypes", {}).items() if "speed" in p}
    served = [speed["daemon_non_finite"] for speed in speeds.values()]
    if served and None not in served:      # the daemons count them where status reports it
        add("daemons: no pass with a non-finite probability (status batching.non_finite)", sum(served), "== 0",
            sum(served) == 0)
    for dtype, bound in SPEED_BOUNDS.items():
        speed = speeds.get(dtype)
        if speed:
            ratio = speed["batched_over_serial"]
            add(f"{dtype}: batched / serial throughput, {speed['clients']} clients", ratio,
                f">= {bound:g}", ratio >= bound, judged=on_gpu)
    judge_graphs(result, add, on_gpu)
    return out


def judge_graphs(result: dict, add, on_gpu: bool) -> None:
    graphs = {dtype: p["graphs"] for dtype, p in result.get("dtypes", {}).items() if p.get("graphs")}
    for dtype, g in graphs.items():
        if "parity" in g:
            diff = g["parity"]["max_abs_diff"]
            if dtype == "fp32":
                add("graphs fp32: max |dp| against passes as they come", diff, f"<= {PARITY_FP32_BOUND:g}",
                    diff <= PARITY_FP32_BOUND)
            bad = sum(g["parity"]["non_finite"].values())
            add(f"graphs {dtype}: every probability finite", bad, "== 0 non-finite", bad == 0)
        served = g.get("passes", {}).get("graphs", {})
        tuned = [c.get("autotune_benchmarks_per_pass") for c in served.values()]
        if tuned and None not in tuned:
            add(f"graphs {dtype}: autotuning benchmarks in served passes", sum(tuned), "== 0", sum(tuned) == 0,
                judged=on_gpu)
        if dtype == "bf16" and "single" in served:
            ms = served["single"]["wall_ms"]
            add("graphs bf16: a pass of one, wall ms", ms, f"<= {GRAPH_PASS_OF_ONE_MS:g}",
                ms <= GRAPH_PASS_OF_ONE_MS, judged=on_gpu)
        daemons = g.get("daemons")
        if dtype == "bf16" and daemons:
            batched = next(iter(daemons["rps_rounds"].values()))
            add("graphs bf16: batched daemon req/s, every round", min(batched), f">= {GRAPH_DAEMON_RPS:g}",
                min(batched) >= GRAPH_DAEMON_RPS, judged=on_gpu)


def print_speed(dtype: str, speed: dict, idle: dict, memory: dict) -> None:
    for label in ("serial", "batched"):
        r = speed[label]
        print(f"  {dtype} {label:7} (max_batch_size {r['max_batch_size']:>2}, {r['concurrency']} clients): "
              f"{r['rps']:8.1f} req/s  p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms  mean batch "
              f"{r['mean_batch_size']:5.2f}")
    print(f"  {dtype} batched / serial: {speed['batched_over_serial']:.2f}x (median of "
          f"{', '.join(f'{x:.2f}' for x in speed['batched_over_serial_rounds'])}); in-process ideal batches "
          f"{speed['inprocess_ideal_rps']:.1f} req/s, the batched daemon {speed['daemon_over_ideal']:.2f} of it")
    print(f"  {dtype} idle p50: in-process {idle['inprocess_p50_ms']:.2f} ms, daemon {idle['daemon_p50_ms']:.2f} ms "
          f"({idle['daemon_over_inprocess']:.3f}x, {idle['overhead_ms']:.2f} ms a request), batched daemon "
          f"{idle['batched_daemon_p50_ms']:.2f} ms")
    peak = memory["inprocess_peak_bytes"]
    workers = [w for ws in memory["workers"].values() for w in ws if w.get("memory_peak_bytes") is not None]
    peaks = ", ".join(f"{w['memory_peak_bytes'] / 2 ** 30:.2f} GiB" for w in workers) or "n/a"
    print(f"  {dtype} peak memory in-process: {'n/a (cpu)' if peak is None else f'{peak / 2 ** 30:.2f} GiB'}; "
          f"workers' peaks: {peaks}")


def print_targets(targets: list[dict]) -> None:
    print("\ntargets")
    for t in targets:
        mark = "not judged on cpu" if not t["judged"] else ("met" if t["met"] else "NOT MET")
        value = f"{t['value']:.3g}" if isinstance(t["value"], float) else t["value"]
        print(f"  [{mark}] {t['target']}: {value} ({t['bound']})")

