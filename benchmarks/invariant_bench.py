"""What --batch-invariant costs, and what it buys: three daemons side by side on one model.

    python benchmarks/invariant_bench.py                   # tiny qwen3, choice readout, short requests
    python benchmarks/invariant_bench.py --requests 256 --rounds 2

- alone:     --max-batch-size 1 (batching off, JevAny's default)
- batched:   --max-batch-size 32, everything else default
- uncached:  --max-batch-size 32 --prefix-cache 0 (what batching costs without the kept prompt head,
             which the invariant passes do without)
- invariant: --max-batch-size 32 --batch-invariant

Throughput: 32 closed-loop client processes (benchmarks/loadgen.py) send the
same requests to each daemon in turn, rounds times; each ratio is taken
within a round, then the median over rounds (this machine drifts by tens of
percent within a minute).

Bit-identity: each batched daemon answers the same requests twice, once all
at once (decide_many: the daemon batches them) and once one at a time (each
request alone in its pass); an answer counts as identical when every
probability and token count is equal, bit for bit.

Writes JSON to --out-dir and prints the figures.
"""
import argparse
import os
import statistics
import tempfile
from pathlib import Path

from harness import HERE, ClientPool, Daemon, like_a_worker, machine, worker_env_in_effect, write_result
from jevany_daemon import workloads
from jevany_daemon.model.tiny import build_tiny_model
from jevany_daemon.parity import exact_part

MEASURED_SEED, WARM_SEED = 1, 2
DAEMONS = {"alone": (1, ()), "batched": (32, ()), "uncached": (32, ("--prefix-cache", "0")),
           "invariant": (32, ("--batch-invariant",))}


def identical(daemon: Daemon, bodies: list) -> dict:
    """Answers batched by the daemon against the same requests sent one at a time."""
    together = daemon.client.decide_many(bodies)
    alone = [daemon.client.decide_request(b) for b in bodies]
    same = sum(exact_part(a) == exact_part(b) for a, b in zip(together, alone, strict=True))
    return {"requests": len(bodies), "bit_identical": same,
            "largest_pass": max(r["batch"]["size"] for r in together)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=512, help="requests a round sends to each daemon")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--identity-requests", type=int, default=256, help="requests of the bit-identity check")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--arch", default="qwen3", choices=("qwen3", "qwen3_5"))
    p.add_argument("--glibc-malloc", action="store_true", help="leave glibc's malloc thresholds as they are")
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    p.add_argument("--name", help="result file stem [default: DEVICE-DTYPE-batch-invariant]")
    args = p.parse_args()
    args.serve_args = []             # harness.Daemon's extra flags: each daemon's own come as its extra
    like_a_worker()

    model_dir = build_tiny_model(Path(tempfile.mkdtemp(prefix="jv-inv-")) / "model", arch=args.arch, readout="choice")
    bodies = workloads.short(args.requests, seed=MEASURED_SEED)
    warm = workloads.short(64, seed=WARM_SEED)
    daemons, pool = {}, ClientPool(args.clients)
    try:
        for name, (batch, extra) in DAEMONS.items():
            daemons[name] = Daemon(model_dir, args, batch, "adaptive", extra)
            pool.run(daemons[name], warm, 8)       # the adaptive policy's first measurements included
        runs = {name: [] for name in daemons}
        for r in range(args.rounds):
            order = list(daemons)[r % len(daemons):] + list(daemons)[:r % len(daemons)]
            for name in order:
                run = pool.run(daemons[name], bodies, args.clients)
                runs[name].append({k: v for k, v in run.items() if k != "latencies"})
                print(f"round {r + 1} {name:9s} {run['rps']:7.1f} req/s, {run['mean_batch_size']:.1f} a pass",
                      flush=True)
        ratios = {
            "invariant_vs_batched": statistics.median(
                i["rps"] / b["rps"] for i, b in zip(runs["invariant"], runs["batched"])),
            "invariant_vs_alone": statistics.median(
                i["rps"] / a["rps"] for i, a in zip(runs["invariant"], runs["alone"])),
            "invariant_vs_uncached": statistics.median(
                i["rps"] / u["rps"] for i, u in zip(runs["invariant"], runs["uncached"])),
            "batched_vs_alone": statistics.median(
                b["rps"] / a["rps"] for b, a in zip(runs["batched"], runs["alone"])),
        }
        check = workloads.short(args.identity_requests, seed=3)
        identity = {name: identical(daemons[name], check) for name in ("batched", "uncached", "invariant")}
    finally:
        pool.close()
        for d in daemons.values():
            d.stop()
    result = {"machine": machine(threads=os.cpu_count(), worker_env=worker_env_in_effect()),
              "settings": {"requests": args.requests, "rounds": args.rounds, "clients": args.clients,
                           "device": args.device, "dtype": args.dtype, "arch": args.arch, "readout": "choice",
                           "workload": "short"},
              "runs": runs, "ratios": ratios, "identity": identity}
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x")
    for name, figures in identity.items():
        print(f"{name}: {figures['bit_identical']} of {figures['requests']} answers bit-identical batched vs alone")
    write_result(result, args.out_dir / f"{args.name or f'{args.device}-{args.dtype}-batch-invariant'}.json")


if __name__ == "__main__":
    main()
