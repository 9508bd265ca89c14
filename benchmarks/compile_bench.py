"""torch.compile on the CPU: is a compiled backbone faster per pass, and are its answers the same?

    python benchmarks/compile_bench.py                 # qwen3 and qwen3_5, tiny width, 32 short requests
    python benchmarks/compile_bench.py --arch qwen3 --passes 8

JevAny's JEVANY_COMPILE compiles the backbone. Here the engine's own passes
run eagerly and then through torch.compile(backbone, dynamic=True), on the
same requests (one pass of --requests, then passes of varied sizes, since a
server never sees one shape twice): the compile (a first pass of --requests,
untimed by the rest), each pass's time, the median over the same passes on
both sides (every size after the first), and the largest probability
difference. CUDA graphs need a GPU and are not measured here.

Writes benchmarks/results/cpu-compile.json (--out).
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness import machine, write_result
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model
from jevany_daemon.parity import compare

HERE = Path(__file__).resolve().parent


def passes(engine: Engine, batches: list[list[dict]]) -> tuple[list, list[float]]:
    outcomes, times = [], []
    for batch in batches:
        admitted = engine.admit_many(batch)
        started = time.perf_counter()
        outcomes += engine.score(admitted)
        times.append(time.perf_counter() - started)
    return outcomes, times


def measure(arch: str, root: Path, args) -> dict:
    model = load_model(str(build_tiny_model(root / arch, arch=arch, readout="choice")), device="cpu")
    config = EngineConfig(max_batch_size=args.requests, batch_policy="greedy", max_padding_waste=1.0)
    sizes = [args.requests] + [max(1, args.requests >> k) for k in range(1, args.passes)]
    batches = [workloads.short(n, seed=i) for i, n in enumerate(sizes)]
    eager = Engine(model, config)
    passes(eager, batches[:1])                                   # warm: the pinned head
    expected, eager_s = passes(eager, batches)
    compiled = Engine(model, config)
    compiled.passes.backbone.module = torch.compile(model.backbone, dynamic=True)
    started = time.perf_counter()
    passes(compiled, batches[:1])                                # the compile, on the first shape
    compile_s = time.perf_counter() - started
    got, compiled_s = passes(compiled, batches)
    report = compare(expected, got)
    # The same passes on both sides: every size after the first (which a shape change may recompile).
    eager_ms, compiled_ms = statistics.median(eager_s[1:]) * 1000, statistics.median(compiled_s[1:]) * 1000
    return {"arch": arch, "sizes": sizes, "compile_s": round(compile_s, 1),
            "eager_ms": [round(t * 1000, 2) for t in eager_s], "compiled_ms": [round(t * 1000, 2) for t in compiled_s],
            "eager_median_ms": round(eager_ms, 2),
            "compiled_median_ms": round(compiled_ms, 2), "speedup": round(eager_ms / compiled_ms, 3),
            "max_abs_diff": report["max_abs_diff"], "decisions_changed": len(report["decisions_changed"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", nargs="+", default=["qwen3", "qwen3_5"], choices=["qwen3", "qwen3_5"])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--passes", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "cpu-compile.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="jv-compile-") as tmp:
        for arch in args.arch:
            rows.append(measure(arch, Path(tmp), args))
            r = rows[-1]
            print(f"{arch:8} eager {r['eager_median_ms']:.1f} ms, compiled {r['compiled_median_ms']:.1f} ms "
                  f"({r['speedup']:.2f}x; compile {r['compile_s']:.0f} s), max |dp| "
                  f"{r['max_abs_diff']:.2e}, decisions changed {r['decisions_changed']}")
    result = {"machine": machine(torch=torch.__version__, threads=args.threads),
              "requests": args.requests, "results": rows}
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
