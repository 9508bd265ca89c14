"""The shape plan: every pass shape (rows x width) a worker serves, fixed from the settings at start.

A forward pass's cost on a GPU is mostly the host's: thousands of kernel
launches, and for every shape not met before, work that is paid once per
shape (Triton's autotuning, cuDNN plans, compiling, capturing a CUDA graph).
So with a plan, a pass is padded up to the bucket of fewest tokens that holds
it, every bucket is run before the worker says ready (Replay.warm_up),
and no served pass meets a shape for the first time. A pass that fits no
bucket runs as it is and is counted (replay.Counts).

Buckets are rows x width: rows on a ladder of half-octave steps (1, 2, 3, 4,
6, 8, 12 ...), widths on quarter-octave steps in multiples of 16 (16, 32 ...
128, 160, 192, 224, 256, 320 ...). The spacing was chosen on the padding it
costs recorded passes (benchmarks/plan_bench.py's spacing phase,
docs/MEASURING.md): quarter-octave widths, against half-octave ones, cut the
tokens padding wastes by up to a third (most in passes of 8 requests) for
1.6 times the buckets; quarter-octave rows would cut up to a fifth more on
the hybrid model, whose rows are its questions, for another 1.6 times the
buckets, each warmed (and captured) at every start. Rows stop at four times
the largest batch (a batch's requests have a row per question on hybrid
models), and no bucket holds more padded tokens than a pass may
(max_packed_tokens); with CUDA graphs, buckets over --cuda-graph-max-tokens
run in their shapes uncaptured.

Every bucket of a plan continues the same cached prefix: the prompt's pinned
head where the engine keeps one (its width is `cached`), else nothing.
"""
import bisect
import math
from typing import NamedTuple

ROW_STEPS_PER_OCTAVE = 2
WIDTH_STEPS_PER_OCTAVE = 4
WIDTH_GRANULE = 16       # widths are multiples of it (a tile of most attention kernels)
ROWS_PER_REQUEST = 4     # rows a batch's request may take on average before its pass falls outside


class PlanTooLarge(ValueError):
    """Warming every bucket would take longer than the warm-up limit; the message says what to change."""


class Bucket(NamedTuple):
    rows: int
    width: int

    @property
    def tokens(self) -> int:
        return self.rows * self.width

    def __str__(self) -> str:
        return f"{self.rows}x{self.width}"


def ladder(first: int, last: int, steps_per_octave: int, granule: int = 1) -> tuple[int, ...]:
    """first, then values about 2**(1/steps) apart, each rounded up to a multiple of granule, through last."""
    out: list[int] = []
    k = 0
    while not out or out[-1] < last:
        raw = first * 2 ** (k / steps_per_octave)
        value = granule * math.ceil(raw / granule - 1e-9)
        if not out or value > out[-1]:
            out.append(min(value, max(last, first)))
        k += 1
    return tuple(out)


class ShapePlan:
    """The buckets a worker serves; fit() picks the one a pass is padded to."""

    def __init__(self, max_rows: int, max_width: int, max_tokens: int, cached: int = 0,
                 row_steps: int = ROW_STEPS_PER_OCTAVE, width_steps: int = WIDTH_STEPS_PER_OCTAVE):
        self.cached = cached
        self.rows = ladder(1, max(1, max_rows), row_steps)
        self.widths = ladder(WIDTH_GRANULE, max(WIDTH_GRANULE, max_width), width_steps, WIDTH_GRANULE)
        self.max_tokens = max_tokens
        self.buckets = tuple(Bucket(n, w) for n in self.rows for w in self.widths if n * w <= max_tokens)
        self._set = frozenset(self.buckets)

    @classmethod
    def for_engine(cls, max_batch_size: int, max_tokens: int, window: int, cached: int) -> "ShapePlan":
        """The plan for an engine's settings: rows for ROWS_PER_REQUEST a request, widths to the window."""
        return cls(max_batch_size * ROWS_PER_REQUEST, min(window, max_tokens), max_tokens, cached)

    def only(self, buckets) -> "ShapePlan":
        """This plan with only these of its buckets (a benchmark's few shapes), fit as before."""
        plan = ShapePlan.__new__(ShapePlan)
        plan.__dict__.update(self.__dict__)
        plan.buckets = tuple(b for b in self.buckets if b in set(buckets))
        plan._set = frozenset(plan.buckets)
        return plan

    def __len__(self) -> int:
        return len(self.buckets)

    def __contains__(self, bucket) -> bool:
        return bucket in self._set

    def fit(self, rows: int, width: int) -> Bucket | None:
        """The smallest bucket holding rows x width, or None when the plan has none."""
        r = bisect.bisect_left(self.rows, rows)
        w = bisect.bisect_left(self.widths, width)
        if r == len(self.rows) or w == len(self.widths):
            return None
        bucket = Bucket(self.rows[r], self.widths[w])
        return bucket if bucket in self._set else None

    def tokens(self, rows: int, width: int) -> float:
        """Padded tokens of a pass of rows x width: its bucket's; where none holds it, more than any pass may
        hold, so a batch never grows out of the plan (its oldest request alone still runs, as it comes)."""
        bucket = self.fit(rows, width)
        return math.inf if bucket is None else bucket.tokens

    def packing_width(self, widest: int, rows_at) -> int:
        """The width to pack a pass's groups into rows of (pass_inputs.Packing): of the widest group's own
        and the plan's widths up to twice it (where two such groups share a row), the one whose bucket
        holds the fewest tokens, given rows_at(width), the rows packing would fill at that width; the
        narrowest of equals."""
        best, fewest = widest, self.tokens(rows_at(widest), widest)
        start, stop = bisect.bisect_left(self.widths, widest), bisect.bisect_left(self.widths, 2 * widest)
        for width in self.widths[start:stop + 1]:
            tokens = self.tokens(rows_at(width), width)
            if tokens < fewest:
                best, fewest = width, tokens
        return best

    def describe(self) -> dict:
        return {"buckets": len(self.buckets), "rows": list(self.rows), "widths": list(self.widths),
                "max_tokens": self.max_tokens, "cached": self.cached,
                "padded_tokens": sum(b.tokens for b in self.buckets)}
