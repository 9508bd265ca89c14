"""gpu-check's invariant phase: --batch-invariant on this device, per dtype, in-process
(docs/SERVING.md#batch-invariant-answers).

The same requests (--parity-n of --workload) are scored one at a time, then in passes of random
companions and places (2 to --batch requests each), by an engine with today's kernels and by a
batch-invariant one: how many answers are bit-identical to their answers alone (every probability
and token count), and each engine's throughput over hand-overs of --batch. Reported, not judged.
"""
import random
import time

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.parity import exact_part

SEED = 7


def bit_identical(engine: Engine, bodies: list, batch: int) -> int:
    """Answers in random passes that equal, bit for bit, the same requests' answers alone."""
    alone = [exact_part(engine.score([engine.admit(b)])[0]) for b in bodies]
    rng = random.Random(SEED)
    order = list(range(len(bodies)))
    rng.shuffle(order)
    same, at = 0, 0
    while at < len(order):
        members = order[at: at + rng.randint(2, batch)]
        at += len(members)
        results = engine.score([engine.admit(bodies[i]) for i in members])
        same += sum(exact_part(r) == alone[i] for i, r in zip(members, results))
    return same


def requests_per_second(engine: Engine, bodies: list, batch: int) -> float:
    """Hand-overs of `batch` admitted requests, after one unmeasured (its shapes met first)."""
    admitted = [engine.admit(b) for b in bodies]
    engine.score(admitted[:batch])
    start = time.perf_counter()
    for i in range(0, len(admitted), batch):
        engine.score(admitted[i: i + batch])      # answers on the host: every pass waited for
    return len(admitted) / (time.perf_counter() - start)


def invariant_phase(model_dir, device: str, dtype: str, args, out: dict) -> None:
    bodies = workloads.WORKLOADS[args.workload](args.parity_n, seed=SEED)
    for name, invariant in (("today", False), ("invariant", True)):
        # a model of its own: the batch-invariant engine swaps its kernels for good
        model = load_model(str(model_dir), device=device, dtype=dtype)
        engine = Engine(model, EngineConfig(max_batch_size=args.batch, batch_policy="greedy",
                                            batch_invariant=invariant))
        out[name] = {"requests": len(bodies), "bit_identical": bit_identical(engine, bodies, args.batch),
                     "rps": requests_per_second(engine, bodies, args.batch)}
        del engine, model
    out["invariant_over_today"] = out["invariant"]["rps"] / out["today"]["rps"]
    print(f"  {dtype} invariant: bit-identical batched vs alone {out['invariant']['bit_identical']}"
          f"/{len(bodies)} (today {out['today']['bit_identical']}/{len(bodies)}); throughput "
          f"{out['invariant']['rps']:.1f} vs {out['today']['rps']:.1f} req/s, "
          f"{out['invariant_over_today']:.2f}x", flush=True)
