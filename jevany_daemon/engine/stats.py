"""What the engine tells observers about its passes: one record per pass, and the running totals."""
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchRecord:
    """One forward pass, as observers and statistics see it."""
    size: int
    padded_tokens: int
    real_tokens: int
    latency_ms: float
    ok: bool
    origins: tuple = ()           # the distinct origins of its requests, sorted


@dataclass
class BatchStats:
    batches: int = 0
    requests: int = 0
    padded_tokens: int = 0
    real_tokens: int = 0
    retried: int = 0         # requests scored again after a pass they were in failed (in halves, passes.py)
    non_finite: int = 0      # passes whose probabilities were not all finite (failed, then retried)
    busy_s: float = 0.0      # time spent in forward passes; over wall time, how saturated the model is
    histogram: Counter = field(default_factory=Counter)

    def record(self, rec: BatchRecord) -> None:
        self.batches += 1
        self.requests += rec.size
        self.padded_tokens += rec.padded_tokens
        self.real_tokens += rec.real_tokens
        self.busy_s += rec.latency_ms / 1000
        self.histogram[rec.size] += 1

    def reset(self) -> None:
        """Back to no passes at all, in place: whoever holds these totals (passes.py) keeps holding them."""
        vars(self).update(vars(BatchStats()))

    def as_dict(self) -> dict:
        return {
            "batches": self.batches,
            "requests": self.requests,
            "mean_batch_size": self.requests / self.batches if self.batches else 0.0,
            "batch_size_histogram": {str(k): v for k, v in sorted(self.histogram.items())},
            "padded_tokens": self.padded_tokens,
            "padding_waste": 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0,
            "retried": self.retried,
            "non_finite": self.non_finite,
            "busy_s": round(self.busy_s, 4),
        }
