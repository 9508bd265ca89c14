"""In-process batching: serial vs batched throughput and parity on one request set, in one run.

    python benchmarks/inprocess.py --workload short --arch qwen3 --readout pointer --batch 8
    python benchmarks/inprocess.py --workload short --n 256 --batch 32 --chunks --max-padding-waste 0.5

Prints a table and writes JSON (--out). Ratios compare within this run only,
because this machine is noisy; absolute figures are not comparable across runs.
"""
import argparse
import json
import tempfile
import time

import torch

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model
from jevany_daemon.parity import compare


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    directory = args.model or build_tiny_model(tempfile.mkdtemp(prefix="jv-bench-") + "/m", arch=args.arch,
                                               readout=args.readout)
    model = load_model(str(directory), dtype=args.dtype)
    bodies = workloads.WORKLOADS[args.workload](args.n, seed=args.seed)
    serial_engine = Engine(model, EngineConfig(layout=args.layout))
    batched_engine = Engine(model, EngineConfig(layout=args.layout, max_batch_size=args.batch,
                                                max_packed_tokens=args.max_packed_tokens,
                                                max_padding_waste=args.max_padding_waste))
    admitted_serial = [serial_engine.admit(b) for b in bodies]
    admitted_batched = [batched_engine.admit(b) for b in bodies]
    serial_engine.score(admitted_serial[:2])      # warm-up, outside the timing
    serial, t_serial = timed(lambda: [serial_engine.score([a])[0] for a in admitted_serial])
    if args.chunks:     # as a server sees them: args.batch requests at a time, in arrival order
        chunks = [admitted_batched[i: i + args.batch] for i in range(0, len(bodies), args.batch)]
        batched, t_batched = timed(lambda: [r for chunk in chunks for r in batched_engine.score(chunk)])
    else:               # the whole set at once: the engine picks each batch from all of it
        batched, t_batched = timed(lambda: batched_engine.score(admitted_batched))
    parity = compare(serial, batched)
    stats = batched_engine.stats.as_dict()
    return {
        "workload": args.workload, "requests": len(bodies), "arch": args.arch, "readout": args.readout,
        "layout": batched_engine.layout.name, "dtype": args.dtype, "max_batch_size": args.batch,
        "max_padding_waste": batched_engine.batch_limits.max_padding_waste, "chunks": args.chunks,
        "threads": args.threads,
        "serial_rps": len(bodies) / t_serial, "batched_rps": len(bodies) / t_batched,
        "speedup": t_serial / t_batched,
        "mean_batch_size": stats["mean_batch_size"], "padding_waste": stats["padding_waste"],
        "max_abs_diff": parity["max_abs_diff"], "mean_abs_diff": parity["mean_abs_diff"],
        "decisions_changed": len(parity["decisions_changed"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(workloads.WORKLOADS), default="short")
    p.add_argument("--arch", choices=("qwen3", "qwen3_5"), default="qwen3")
    p.add_argument("--readout", choices=("choice", "pointer", "lm_token"), default="pointer")
    p.add_argument("--model", help="an existing model directory instead of a fresh tiny one")
    p.add_argument("--layout", choices=("auto", "rows", "packed"), default="auto")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-packed-tokens", type=int, default=8192)
    p.add_argument("--max-padding-waste", type=float, help="[default: the device's, see config.py]")
    p.add_argument("--chunks", action="store_true", help="hand requests over --batch at a time, in order, as "
                   "a server receives them, instead of the whole set at once")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write the result as JSON here")
    result = run(p.parse_args())
    print(json.dumps(result, indent=1))
    if p.parse_args().out:
        with open(p.parse_args().out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
