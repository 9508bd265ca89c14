"""gpu-check's parity phase: every readout x layout x dtype, batched vs one at a time, in-process.

Each configured layout runs with the prefix cache off, so the case is that
layout's own path; the cached path (the default: prefix cache on) is a case
of its own per arch, with states short enough to be kept so its batched run
meets hits. Every case records the path that served it.
"""
import itertools
import math

from bench import engine
from jevany_client.errors import JevanyError
from jevany_daemon import workloads
from jevany_daemon.model.loading import load_model
from jevany_daemon.parity import compare

READOUTS = ("choice", "pointer", "lm_token")
DTYPES = ("fp32", "bf16")
# The layouts each arch is proven for (engine.choose_layout): together they cover every layout.
LAYOUTS = {"qwen3_5": ("rows", "shared"), "qwen3": ("packed",)}
CACHED = "cached"        # the prefix cache's path: layout auto with the cache on
CACHED_SETTINGS = dict(layout="auto", prefix_cache=64, prefix_min_tokens=1)


def probabilities(outcome: dict) -> list[float]:
    return [p for answer in outcome["answers"].values() for p in answer["probabilities"].values()]


def parity_case(model, layout: str, bodies: list, batch: int) -> dict:
    """Batched vs one at a time on one engine. Finiteness is counted here over both runs, not
    left to compare(): a NaN makes max() and <= quietly wrong."""
    settings = CACHED_SETTINGS if layout == CACHED else dict(layout=layout, prefix_cache=0)
    e = engine(model, **settings, max_batch_size=batch, max_padding_waste=1.0, batch_policy="greedy",
               max_packed_tokens=1 << 16)
    serial = [e.score([e.admit(b)])[0] for b in bodies]
    passes, scored = e.stats.batches, e.stats.requests
    admitted = [e.admit(b) for b in bodies]
    paths = sorted({e.layout_for(a).name for a in admitted})
    batched = e.score(admitted)
    ok = [i for i, (a, b) in enumerate(zip(serial, batched)) if not isinstance(a, JevanyError)
          and not isinstance(b, JevanyError)]
    failed = [f"{i}: {o}" for i, pair in enumerate(zip(serial, batched)) for o in pair if isinstance(o, JevanyError)]
    r = compare([serial[i] for i in ok], [batched[i] for i in ok])
    values = [p for i in ok for p in probabilities(serial[i]) + probabilities(batched[i])]
    cache = e.prefix_cache_stats()
    return {"layout": layout, "path": ",".join(paths), "prefix_cache": bool(cache["enabled"]),
            "cache_hits": cache.get("hits", 0), "requests": len(bodies), "probabilities": r["probabilities"],
            "max_abs_diff": r["max_abs_diff"], "mean_abs_diff": r["mean_abs_diff"],
            "decisions_changed": len(r["decisions_changed"]),
            "changed": [f"{ok[i]}:{q}" for i, q in r["decisions_changed"]],
            "non_finite": sum(not math.isfinite(p) for p in values), "checked_finite": len(values),
            "errors": len(failed), "error_messages": failed[:5],
            # questions or options present on one side only (compare() reports them where it knows how)
            "mismatched": len(r.get("mismatched", [])),
            "batched_mean_batch_size": (e.stats.requests - scored) / max(1, e.stats.batches - passes)}


def cases(dtypes=DTYPES) -> list[tuple[str, str, str, str]]:
    """(arch, readout, dtype, layout) of every parity case in these dtypes."""
    return [(arch, readout, dtype, layout) for arch, readout, dtype in itertools.product(LAYOUTS, READOUTS, dtypes)
            for layout in (*LAYOUTS[arch], CACHED)]


def parity_phase(dirs: dict, device: str, args, rows: list, memory) -> None:
    """Appends to rows case by case, so a run cut short keeps the cases it finished.

    memory: (release, reset_peak, peak_bytes) of the device, so each model's peak is its own.
    """
    release, reset_peak, peak_bytes = memory
    bodies = workloads.mixed(args.parity_n, seed=7, max_words=30)
    for (arch, readout, dtype), group in itertools.groupby(cases(args.dtypes), key=lambda c: c[:3]):
        release(device)
        reset_peak(device)
        model = load_model(str(dirs[arch, readout]), device=device, dtype=dtype)
        for *_, layout in group:     # one load serves every layout of this model
            rows.append({"arch": arch, "readout": readout, "dtype": dtype,
                         **parity_case(model, layout, bodies, args.batch), "peak_memory_bytes": peak_bytes(device)})
            print_parity(rows[-1])
        del model
    release(device)


def print_parity(r: dict) -> None:
    print(f"  {r['arch']:8} {r['readout']:8} {r['layout']:6} {r['dtype']} ({r['path']}): max {r['max_abs_diff']:.2e}"
          f"  mean {r['mean_abs_diff']:.2e}  decisions changed {r['decisions_changed']}  non-finite "
          f"{r['non_finite']}/{r['checked_finite']}  errors {r['errors'] + r['mismatched']}  mean batch "
          f"{r['batched_mean_batch_size']:.1f}")
