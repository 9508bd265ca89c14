"""Warm-up: score small requests through every path the engine will use, before serving.

On a GPU the first pass pays for lazy initialisation (the CUDA context,
cuBLAS handles, kernel selection), and a kernel that cannot run on this
device fails on first use. Warming up moves both to load time: the first
user request costs what every later one does, and a model that cannot score
here stops its worker with a clear message instead of failing every request.
"""
from jevany_client.errors import JevanyError

from jevany_daemon.parity import exact_part

from .engine import Admitted, Engine

# One question takes the layouts' single-branch path; two questions the
# shared-state path (the shared layout's prefix pass and cache continuation).
_ONE = {"state": {"warm": "up"}, "questions": {"go": {"type": "noul"}}}
_TWO = {"state": {"warm": "up", "n": 2},
        "questions": {"pick": {"type": "choice", "criteria": {"left": None, "right": None}},
                      "rate": {"type": "score", "criteria": ["low", "high"]}}}


class WarmUpError(RuntimeError):
    """The model cannot score on this device; the message says why."""


def _probes() -> list[dict]:
    """Requests of widths from a few tokens to a few hundred, with one and two questions: a pass of them
    pads every row but the widest, and each sits at another place than alone."""
    words = "order refund account delivery status ticket login payment".split()
    return [{"state": {"note": " ".join(words[i % len(words)] for i in range(n))},
             "questions": {"q": {"type": "noul"}} if n % 2 else dict(_TWO["questions"])}
            for n in (3, 17, 60, 131, 250, 9)]


def warm_up(engine: Engine) -> list[str]:
    """Run every path once; return the paths run. Raises WarmUpError if one fails.

    A request the configured limits refuse is left out (no user request of
    its shape could reach that path either); a request that fails while
    scoring is the model or device failing, and stops the load.
    """
    bodies = [_ONE, _TWO]
    if engine.prefix_cache is not None:
        # A state long enough to be cached takes the prefix cache's two passes.
        bodies.append({**_TWO, "state": " ".join(["warm"] * engine.prefix_cache.min_tokens)})
    admitted = []
    for body in bodies:
        try:
            admitted.append(engine.admit(body))
        except JevanyError:
            continue
    paths = []
    for a in admitted:
        _run(engine, [a])
        cached = engine.prefix_cache is not None and engine.prefix_cache.eligible(a.encoded.stem)
        paths.append(f"{len(a.request.questions)} question(s) alone{', prefix cached' if cached else ''}")
    if len(admitted) > 1 and engine.config.max_batch_size > 1:
        _run(engine, admitted[:2])
        paths.append("batched")
    if engine.config.batch_invariant and engine.config.max_batch_size > 1:
        _check_invariance(engine)
        paths.append("batch-invariant, checked")
    engine.reset_statistics()    # warm-up passes are neither traffic nor a fair speed sample
    return paths


def _check_invariance(engine: Engine) -> None:
    """--batch-invariant rests on how this host's kernels order their sums (model/invariant.py): answers
    batched and alone are compared here, bit for bit, before the worker serves anything."""
    probes = []
    for body in _probes():
        try:
            probes.append(engine.admit(body))
        except JevanyError:
            continue          # refused by the configured limits: no request of its shape gets through either
    probes = probes[:engine.config.max_batch_size]
    alone = [exact_part(_run(engine, [a])[0]) for a in probes]
    for order in (probes, probes[::-1]):
        batched = [exact_part(o) for o in _run(engine, order)]
        expected = alone if order is probes else alone[::-1]
        if batched != expected:
            raise WarmUpError(f"batch_invariant: on this host ({engine.model.device}, "
                              f"{engine.model.dtype}) an answer batched differs from its answer alone in its "
                              "last bits, so the setting cannot keep its promise here; serve without it")


def _run(engine: Engine, batch: list[Admitted]) -> list:
    """One pass of exactly this batch, its outcomes; a batched pass that fell back to scoring alone counts
    as failed."""
    outcomes = engine.run_batch(batch)
    for outcome in outcomes:
        if isinstance(outcome, JevanyError):
            raise WarmUpError(f"warm-up scoring failed on {engine.model.device}: {outcome.message}")
        if outcome["batch"]["size"] != len(batch):
            raise WarmUpError(f"warm-up: a batched pass failed on {engine.model.device}; "
                              "its requests only scored alone")
    return outcomes
