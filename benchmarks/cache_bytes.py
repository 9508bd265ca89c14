"""What a prefix cache entry costs in memory: bytes per kept token, and bytes per entry whatever its length.

    python benchmarks/cache_bytes.py                      # tiny qwen3 and qwen3_5, FP32 and BF16
    python benchmarks/cache_bytes.py --shape 0.8b         # Qwen3.5-0.8B's layer shape (builds ~1.5 GB)

It builds each model on the spot (random weights, nothing downloaded), keeps
two states of different lengths through a real engine, and solves
bytes = per_token * tokens + per_entry from the two entries' measured sizes:
attention keys and values grow with the tokens, linear-attention states do not.
"""
import argparse
import json
import tempfile
from pathlib import Path

from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.prefix_cache import cache_nbytes
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.tiny import build_tiny_model


def measure(model_dir: Path, dtype: str) -> dict:
    model = load_model(str(model_dir), device="cpu", dtype=dtype)
    engine = Engine(model, EngineConfig(prefix_cache=2, prefix_min_tokens=1))
    sizes = {}
    for words in (50, 150):
        body = {"state": " ".join(["parcel", "late"] * words), "questions": {"q": {"type": "noul"}}}
        stem = engine.admit(body).encoded.stem
        engine.score([engine.admit(body)])
        sizes[len(stem)] = cache_nbytes(engine.prefix_cache.entry(stem).cache)
    (n1, b1), (n2, b2) = sorted(sizes.items())
    per_token = (b2 - b1) / (n2 - n1)
    return {"bytes_per_token": per_token, "bytes_per_entry": b1 - per_token * n1,
            "tokens_per_gib": int((1 << 30) / per_token)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="tiny", choices=("tiny", "0.8b"))
    p.add_argument("--arch", nargs="+", default=["qwen3", "qwen3_5"])
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="jv-bytes-"))
    rows = []
    for arch in args.arch:
        model_dir = build_tiny_model(root / arch, arch=arch, readout="choice", shape=args.shape)
        for dtype in args.dtype:
            row = {"arch": arch, "shape": args.shape, "dtype": dtype, **measure(model_dir, dtype)}
            rows.append(row)
            print(f"{arch:8} {args.shape:5} {dtype}: {row['bytes_per_token']:,.0f} bytes a token, "
                  f"{row['bytes_per_entry']:,.0f} bytes an entry; 1 GiB holds {row['tokens_per_gib']:,} tokens",
                  flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
