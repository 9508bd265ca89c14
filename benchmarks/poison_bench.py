"""What one request that breaks every pass it joins costs the requests batched with it.

    python benchmarks/poison_bench.py --out benchmarks/results/cpu-poison.json
    python benchmarks/poison_bench.py --device cuda --dtype bf16      # where a pass costs its host time

A tiny model built on the spot (nothing downloaded), a greedy engine of
--batch requests, one of which makes every pass holding it fail (as a bad
input or a request that runs the device out of memory would). Each row scores
the same batch: clean, then poisoned with the failed pass's requests retried
in halves down to one (passes.py) and, for comparison in the same run, each
retried alone (fewer rows, more passes). The neighbours' answers come with
the batch's, so the batch's wall time is what the poison costs them.
"""
import argparse
import json
import tempfile
import time
from pathlib import Path

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.passes import Passes
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model

POISON = {"state": "zebra crossing", "questions": {"q": {"type": "noul"}}}


def _alone(self, launched):
    """The alternative: every request of a failed pass scored again alone."""
    batch = launched.batch
    self.forget(batch)
    if len(batch) == 1:
        return [launched.error]
    return [self.collect(self.launch([a]))[0] for a in batch]


def run(engine: Engine, bodies: list, poisoned: bool, retry) -> dict:
    admitted = engine.admit_many(bodies + ([POISON] if poisoned else []))
    marker = list(admitted[-1].encoded.prefix) if poisoned else None
    backbone, passes = engine.passes.backbone, []

    def failing(**inputs):
        rows = inputs["input_ids"].tolist()
        passes.append(len(rows))
        if marker and any(row[i:i + len(marker)] == marker for row in rows for i in range(len(row) - len(marker) + 1)):
            raise RuntimeError("injected fault")
        return backbone(**inputs)

    engine.passes.backbone = failing
    saved, Passes._failed = Passes._failed, retry or Passes._failed
    try:
        started = time.perf_counter()
        outcomes = engine.score(admitted)
        seconds = time.perf_counter() - started
    finally:
        engine.passes.backbone, Passes._failed = backbone, saved
    answered = sum(isinstance(o, dict) for o in outcomes)
    return {"passes": len(passes), "rows": passes, "seconds": round(seconds, 4), "answered": answered}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="requests in the batch, the poison included")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    model_dir = build_tiny_model(Path(tempfile.mkdtemp(prefix="jv-poison-")), arch="qwen3", readout="choice")
    engine = Engine(load_model(str(model_dir), device=args.device, dtype=args.dtype),
                    EngineConfig(max_batch_size=args.batch, batch_policy="greedy", max_padding_waste=1.0,
                                 prefix_cache=0))
    bodies = workloads.short(args.batch - 1, seed=3)
    rows = {}
    for name, poisoned, retry in (("clean", False, None), ("poisoned, retried in halves", True, None),
                                  ("poisoned, retried alone", True, _alone)):
        runs = [run(engine, bodies, poisoned, retry) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["seconds"])
        rows[name] = best
        print(f"{name:30} {best['passes']:3d} passes {best['seconds'] * 1000:8.1f} ms  "
              f"{best['answered']} of {len(bodies)} neighbours answered", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"batch": args.batch, "repeats": args.repeats, "device": args.device,
                                        "dtype": args.dtype, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
