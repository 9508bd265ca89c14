"""Passes in the shape plan's fixed shapes: warmed before ready, then run eagerly, compiled or replayed.

With a plan (shape_plan.py), a prepared pass that is one forward over one
grid (continuing the pinned head, or nothing: the layouts' ``single``) and
fits a bucket runs as that bucket's FixedForward (fixed_forward.py): one
upload into its static buffer, one call, one download. How the call runs is
the runner:

- ``eager``: the forward as it is, in the bucket's shape, so nothing tuned
  per shape (Triton's autotuning in flash-linear-attention, cuBLAS's picks)
  is ever met on a served pass;
- ``compiled``: each bucket's forward through torch.compile, whole
  (fullgraph: a graph break is an error at warm-up), its shapes static. A
  served pass that would compile again runs eagerly instead and is counted
  (``recompiles``): the plan is sized within dynamo's recompile limit, and
  warm-up met every bucket;
- ``graphs``: each bucket (up to --cuda-graph-max-tokens padded tokens)
  captured as a CUDA graph into one memory pool shared by all, replayed per
  pass. On a CPU the same runner makes a plain call where CUDA would capture
  and replay (``Plain``), so everything around the capture is tested here.

Anything else (a stem or prefix pass of its own, a cache hit beyond the
head, a pass that keeps a state, media, a blended readout, a shape outside
the plan, more readout positions than a bucket gathers) runs as it did
before any plan, counted by reason. Warm-up runs every bucket (what it
tunes and builds per shape happens then), then compiles it, captures it or
runs it again, largest first, before the worker reports ready, within
--warmup-limit seconds: a plan that would take longer stops the start with
a settings error that names what to change.
"""
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from .cache_rows import Block, CacheKit
from .fixed_forward import FixedForward, own_copy
from .shape_plan import Bucket, PlanTooLarge, ShapePlan

RUNNERS = ("eager", "compiled", "graphs")
# Warm-up estimates its total after this many buckets, and stops the start as soon as it would overrun.
ESTIMATE_AFTER = 3


@dataclass
class Counts:
    planned: int = 0                  # passes run in a bucket's shape (a failed one too, as batches counts it)
    eager: Counter = field(default_factory=Counter)   # passes run as they came, by reason
    recompiles: int = 0                               # compiled passes that would have compiled again

    def as_dict(self) -> dict:
        return {"planned": self.planned, "eager": dict(self.eager), "recompiles": self.recompiles}

    def reset(self) -> None:
        self.planned, self.recompiles = 0, 0
        self.eager.clear()


class Fixed(NamedTuple):
    """A pass laid out in a bucket: what its upload holds, and how much of its download the host reads."""
    bucket: Bucket
    values: list[int]
    used: int


class Plain:
    """Where CUDA would capture and replay: the forward called as it is (on a CPU, and in the tests)."""

    def __init__(self, forward: Callable[[], torch.Tensor]):
        self.forward = forward

    def replay(self) -> torch.Tensor:
        return self.forward()


class Captured:
    """A CUDA graph of a bucket's forward, and the output tensor each replay writes."""

    def __init__(self, forward: Callable[[], torch.Tensor], pool, device: torch.device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            forward()                 # anything lazy (workspaces, kernels) happens before the capture
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = forward()

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


class Compiled:
    """torch.compile of a bucket's forward; a call that would compile again runs the forward eagerly."""

    def __init__(self, forward: Callable[[], torch.Tensor], mode: str | None, backend: str, counts: Counts):
        self.forward, self.counts = forward, counts
        self.compiled = torch.compile(forward, fullgraph=True, dynamic=False, mode=mode, backend=backend)
        self.serving = False

    def replay(self) -> torch.Tensor:
        if not self.serving:
            return self.compiled()
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self.compiled()
        except RuntimeError as exc:
            if "recompile" not in str(exc).lower():
                raise
            self.counts.recompiles += 1
            return self.forward()


# Compiled runners use inductor; the tests check graphs and recompiles with dynamo's eager backend.
COMPILE_BACKEND = "inductor"


class Replay:
    """The plan's buckets of one engine: which pass runs in which, and how (see the module's docstring)."""

    def __init__(self, plan: ShapePlan, runner: str, readout, backbone, dtype, device, pad_id: int,
                 compile_mode: str | None = None, graph_max_tokens: int | None = None):
        if runner not in RUNNERS:
            raise ValueError(f"runner must be one of {RUNNERS}, got {runner!r}")
        self.plan, self.runner, self.readout, self.backbone = plan, runner, readout, backbone
        self.dtype, self.device, self.pad_id, self.compile_mode = dtype, device, pad_id, compile_mode
        self.graph_max_tokens = plan.max_tokens if graph_max_tokens is None else graph_max_tokens
        self.readout_kind = "pointer" if hasattr(readout, "head") else "label"
        self.head: Block | None = None          # the runner's own copy of the head every bucket continues
        self.slots: dict[Bucket, FixedForward] = {}
        self.calls: dict[Bucket, object] = {}   # Plain, Compiled or Captured, by bucket
        self.counts = Counts()
        self.warm_up_s: dict[str, float] = {}
        self.capture_bytes: dict[Bucket, int] = {}   # CUDA: what each capture added to the allocator's reserve

    # --- a pass -------------------------------------------------------------------

    def fixed(self, job, counts: list[int], live_head: Block | None) -> Fixed | None:
        """The pass as its bucket's inputs, or None (counted by why) when it runs as it came."""
        single = job.single() if hasattr(job, "single") else None
        if single is None or (single.continues is not live_head if self.plan.cached else single.continues
                              is not None):
            return self._eager("layout")
        bucket = self.plan.fit(single.sent.n, single.sent.width)
        slot = self.slots.get(bucket)
        if slot is None:
            return self._eager("shape")
        lists = self.readout.fixed_lists(counts, slot.gathered)
        if lists is None:
            return self._eager("readouts")
        self.counts.planned += 1
        return Fixed(bucket, slot.values(single.sent, lists), self.readout.fixed_used(counts))

    def _eager(self, reason: str) -> None:
        self.counts.eager[reason] += 1
        return None

    def count_eager(self, reason: str) -> None:
        """A pass the engine ran as it came before asking (media, a blended readout)."""
        self.counts.eager[reason] += 1

    def run(self, fixed: Fixed, stream) -> torch.Tensor:
        """Fill the bucket's buffer (the pass's one upload) and run it: its probabilities, fixed layout."""
        stream.fill(self.slots[fixed.bucket].buffer, fixed.values)
        return self.calls[fixed.bucket].replay()

    # --- warm-up --------------------------------------------------------------------

    def warm_up(self, head: Block | None, kit: CacheKit | None, stream, limit_s: float) -> dict[str, float]:
        """Run every bucket, then compile, capture or run it again; → seconds per phase. Raises PlanTooLarge."""
        if self.plan.cached and head is None:
            raise ValueError("the plan continues the prompt's head, and none is pinned")
        self.head = own_copy(head) if head is not None else None
        started = time.monotonic()
        buckets = sorted(self.plan.buckets, key=lambda b: -b.tokens)   # largest first: the pool's peak first
        pool = torch.cuda.graph_pool_handle() if self.runner == "graphs" and self.device.type == "cuda" else None
        if self.runner == "compiled":
            _room_for(len(buckets))
        phases = Counter()       # first_runs: the eager runs (tuning); then compile or capture
        total_tokens, done_tokens = sum(b.tokens for b in buckets), 0
        with torch.inference_mode():
            for i, bucket in enumerate(buckets, 1):
                slot = FixedForward(bucket, self.readout, self.readout_kind, self.backbone, self.dtype, self.device,
                                    self.pad_id, self.head, kit)
                self.slots[bucket] = slot
                began = time.monotonic()
                stream.fill(slot.buffer, slot.warm_values())
                slot.forward()                             # tunes, builds, allocates what it meets
                stream.synchronize()
                phases["first_runs"] += time.monotonic() - began
                began, reserved = time.monotonic(), _reserved(self.device, settled=pool is not None)
                self.calls[bucket] = self._call(slot, bucket, pool)
                stream.synchronize()
                if self.runner != "eager":
                    phases["compile" if self.runner == "compiled" else "capture"] += time.monotonic() - began
                if isinstance(self.calls[bucket], Captured):
                    self.capture_bytes[bucket] = _reserved(self.device) - reserved
                done_tokens += bucket.tokens
                self._check_time(started, limit_s, i, len(buckets), done_tokens, total_tokens)
        for call in self.calls.values():
            if isinstance(call, Compiled):
                call.serving = True
        self.warm_up_s = {phase: round(s, 3) for phase, s in phases.items()}
        return self.warm_up_s

    def _call(self, slot: FixedForward, bucket: Bucket, pool):
        """The bucket's call, run before it serves: a compiled one twice (the first compiles); a captured
        one once before its capture (Captured); a plain one once more, as it will be served."""
        if self.runner == "compiled":
            call = Compiled(slot.forward, self.compile_mode, COMPILE_BACKEND, self.counts)
            call.replay()
            call.replay()
            return call
        if self.runner == "graphs" and self.device.type == "cuda" and bucket.tokens <= self.graph_max_tokens:
            return Captured(slot.forward, pool, self.device)
        call = Plain(slot.forward)
        call.replay()
        return call

    def _check_time(self, started: float, limit_s: float, done: int, total: int, done_tokens: int,
                    total_tokens: int) -> None:
        elapsed = time.monotonic() - started
        # Compiling costs about the same for every bucket; running and capturing, about their tokens. The
        # buckets go largest first, so a per-bucket estimate of running ones would be several times over.
        estimate = elapsed / done * total if self.runner == "compiled" else elapsed / done_tokens * total_tokens
        if elapsed > limit_s or (done >= ESTIMATE_AFTER and estimate > limit_s):
            raise PlanTooLarge(
                f"warming the shape plan's {total} buckets ({self.runner}) would take about {estimate:.0f} s, "
                f"over the warm-up limit of {limit_s:g} s ({done} done in {elapsed:.1f} s): raise --warmup-limit, "
                "or make the plan smaller with a lower --max-packed-tokens or --max-batch-size"
                + (" or --cuda-graph-max-tokens" if self.runner == "graphs" else ""))

    # --- what it tells ----------------------------------------------------------------

    def describe(self) -> dict:
        captured = sum(isinstance(c, Captured) for c in self.calls.values())
        return {"runner": self.runner, **self.plan.describe(), "warm_up_s": dict(self.warm_up_s),
                "captured": captured, "capture_bytes": sum(self.capture_bytes.values()),
                "compile_mode": self.compile_mode if self.runner == "compiled" else None}


def _reserved(device: torch.device, settled: bool = False) -> int:
    """The CUDA allocator's reserve; settled: after giving back its cached blocks, as a capture does first
    (torch.cuda.graph empties the cache), so that what a capture adds is what its pool keeps."""
    if device.type != "cuda":
        return 0
    if settled:
        torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device)


def _room_for(buckets: int) -> None:
    """Let dynamo keep a compiled graph per bucket: they share one code object (FixedForward.forward),
    whose cache entries the recompile limits bound; past them it would fail instead of falling back."""
    import torch._dynamo.config as dynamo

    dynamo.recompile_limit = max(dynamo.recompile_limit, buckets + 1)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 2 * buckets + 8)
    dynamo.fail_on_recompile_limit_hit = True
