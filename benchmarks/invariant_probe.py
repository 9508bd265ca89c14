"""Where a row's bits depend on its pass: the measurements behind --batch-invariant's kernels (model/invariant.py).

    python benchmarks/invariant_probe.py                  # this host's CPU, two threads
    python benchmarks/invariant_probe.py --device cuda --threads 0

- products: 16 rows placed at random offsets in products of P rows, for
  each P, shape and dtype; counts tries whose rows differ from the first
  try of the same P (same shape: must be 0, whatever the offset) and the P
  whose rows differ from P = 16 (what a product of another size does).
- attention: rows of 3 to 1,200 tokens, each padded alone to a multiple of
  32, run through SDPA beside 0 to 11 others of their width (as
  run_attention groups them); counts rows whose bits differ from the row
  alone.

Prints the counts and writes JSON to --out-dir. Not timed: the kernels'
cost is invariant_bench.py's.
"""
import argparse
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from harness import HERE, machine, write_result
from jevany_daemon.model.invariant import round_width

SHAPES = ((256, 512), (1024, 3584), (3584, 1024), (256, 64))      # (K, N): the tiny model's and a 0.8B's
PIECES = (16, 32, 48, 64, 128, 256, 512, 1024)
TRIES = 6


def products(device: str, dtype: torch.dtype, gen: torch.Generator, rng: random.Random) -> dict:
    out = {}
    for k, n in SHAPES:
        weight = torch.randn(n, k, generator=gen).to(device, dtype).t()
        mine = torch.randn(16, k, generator=gen).to(device, dtype)
        first = {}
        for p in PIECES:
            tries = []
            for _ in range(TRIES):
                at = rng.randint(0, p - 16)
                rows = torch.randn(p, k, generator=gen).to(device, dtype)
                rows[at: at + 16] = mine
                tries.append(torch.mm(rows, weight)[at: at + 16])
            first[p] = tries[0]
            out[f"{k}x{n} P={p}"] = {"tries_differing": sum(not torch.equal(t, tries[0]) for t in tries),
                                     "differs_from_P16": not torch.equal(tries[0], first[16])}
    return out


def attention(device: str, dtype: torch.dtype, gen: torch.Generator, rng: random.Random) -> dict:
    heads, kv_heads, dim, rows, moved = 8, 2, 64, 0, 0
    for _ in range(30):
        lengths = [rng.randint(3, 1200) for _ in range(rng.randint(1, 12))]
        widths = [round_width(n) for n in lengths]
        for width in set(widths):
            mine = [i for i, w in enumerate(widths) if w == width]
            q = torch.randn(len(mine), heads, width, dim, generator=gen).to(device, dtype)
            k, v = (torch.randn(len(mine), kv_heads, width, dim, generator=gen).to(device, dtype).repeat_interleave(
                heads // kv_heads, 1) for _ in range(2))
            together = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            for j, i in enumerate(mine):
                alone = F.scaled_dot_product_attention(q[j: j + 1], k[j: j + 1], v[j: j + 1], is_causal=True)
                rows += 1
                moved += not torch.equal(alone[0, :, :lengths[i]], together[j, :, :lengths[i]])
    return {"rows": rows, "differing": moved}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="torch's threads (0: leave as it is)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen, rng = torch.Generator().manual_seed(args.seed), random.Random(args.seed)
    result = {"machine": machine(threads=torch.get_num_threads()), "device": args.device, "dtypes": {}}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        figures = {"products": products(args.device, dtype, gen, rng),
                   "attention": attention(args.device, dtype, gen, rng)}
        result["dtypes"][name] = figures
        same_p = sum(f["tries_differing"] for f in figures["products"].values())
        other_p = sorted(key for key, f in figures["products"].items() if f["differs_from_P16"])
        print(f"{name}: products of one size, rows at random offsets: {same_p} of "
              f"{len(figures['products']) * (TRIES - 1)} tries differ; "
              f"differing from 16 rows: {', '.join(other_p) or 'none'}")
        print(f"{name}: attention beside rows of one width: {figures['attention']['differing']} of "
              f"{figures['attention']['rows']} rows differ")
    write_result(result, args.out_dir / f"{args.device}-invariant-probe.json")


if __name__ == "__main__":
    main()
