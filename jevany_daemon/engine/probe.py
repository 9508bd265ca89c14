"""What a pass costs the host, counted on any machine: the proxies of GPU throughput.

On a GPU the device is fast and the host decides throughput: every torch op
outside a view is a kernel launch (about 5 µs of host time on CUDA), every
scalar read waits for the device, and host time outside the forward is time
the device may sit idle. None of that needs a GPU to count. ``Probe`` wraps
an engine's backbone and counts, while it is active:

- forwards: backbone calls;
- ops outside and inside the forward: aten ops that are not views; a pass
  run in a bucket of the shape plan (replay.py) counts its whole call (masks,
  join, decoder, readout: what a CUDA graph would replay) as inside;
- scalar reads: ``.item()``, ``bool(tensor)`` and the like, each a device sync
  on CUDA (``.tolist()`` does not dispatch, so the stream counts its own);
- host seconds inside the forward, wall and this thread's CPU time;
- with ``active(ops=False, op_time=True)``: the seconds ops outside the forward
  spend computing. On a CPU that is the device's work done on the host (a
  mask, a gather); on CUDA those ops are launches and the host goes on. What
  is left of the host's time without it is what a GPU host would still pay.

Used by benchmarks/host_bench.py and by the tests that hold the budgets.
"""
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that read a device value into Python: a sync on CUDA.
SCALAR_READS = frozenset({"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.equal.default"})


@dataclass
class Counts:
    forwards: int = 0
    ops_outside: int = 0
    ops_inside: int = 0
    scalar_reads: int = 0
    forward_s: float = 0.0        # wall time inside backbone calls
    forward_cpu_s: float = 0.0    # this thread's CPU time inside them
    op_outside_s: float = 0.0     # wall time inside ops outside the forward (op_time only)
    outside_by_op: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"forwards": self.forwards, "ops_outside": self.ops_outside, "ops_inside": self.ops_inside,
                "scalar_reads": self.scalar_reads, "forward_ms": round(self.forward_s * 1000, 3),
                "top_ops_outside": dict(self.outside_by_op.most_common(8))}


class _OpCounter(TorchDispatchMode):
    def __init__(self, counts: Counts, timing: bool = False):
        super().__init__()
        self.counts, self.depth, self.timing = counts, 0, timing

    @property
    def inside(self) -> bool:
        return self.depth > 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.timing:
            if self.inside:
                return func(*args, **(kwargs or {}))
            began = time.perf_counter()
            try:
                return func(*args, **(kwargs or {}))
            finally:
                self.counts.op_outside_s += time.perf_counter() - began
        name = str(func)
        if name in SCALAR_READS:
            self.counts.scalar_reads += 1
        if not func.is_view:
            if self.inside:
                self.counts.ops_inside += 1
            else:
                self.counts.ops_outside += 1
                self.counts.outside_by_op[name] += 1
        return func(*args, **(kwargs or {}))


class _Inert:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Probe:
    """Counts what an engine's passes cost while ``with probe.active():`` runs.

    Counting ops sends every op through Python, which slows everything many
    times over: time passes with ``active(ops=False)``, count with ops=True.
    op_time (with ops=False) times the ops outside the forward, and only them.
    """

    def __init__(self, engine):
        self.engine = engine
        self.counts = Counts()
        self._mode: _OpCounter | None = None

    def reset(self) -> None:
        self.counts = Counts()
        if self._mode is not None:
            self._mode.counts = self.counts

    @contextmanager
    def active(self, ops: bool = True, op_time: bool = False):
        backbone = self.engine.model.backbone
        original = backbone.forward
        self._mode = mode = _OpCounter(self.counts, timing=op_time and not ops)

        def forward(*args, **kwargs):
            mode.counts.forwards += 1
            with self._inside(mode):
                return original(*args, **kwargs)

        def planned(call):
            def replay():
                with self._inside(mode, timed=False):
                    return call()
            return replay

        backbone.forward = forward
        calls = list(self.engine.replay.calls.values()) if getattr(self.engine, "replay", None) else []
        for call in calls:
            call.replay = planned(call.replay)
        try:
            with mode if ops or op_time else _Inert():
                yield self
        finally:
            backbone.forward = original
            for call in calls:
                del call.replay          # the class's method again
            self._mode = None

    @contextmanager
    def _inside(self, mode: _OpCounter, timed: bool = True):
        mode.depth += 1
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            if timed:
                mode.counts.forward_s += time.perf_counter() - wall
                mode.counts.forward_cpu_s += time.thread_time() - cpu
            mode.depth -= 1
