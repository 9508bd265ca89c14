"""Live counters behind the status op: outcomes by code, latency percentiles, batching."""
from collections import Counter, deque

LATENCY_WINDOW = 4096   # recent decide replies the percentiles are taken over


class Counters:
    def __init__(self):
        self.ok = 0
        self.error = 0
        self.by_code: Counter = Counter()
        self.by_op: Counter = Counter()
        self._latency: deque = deque(maxlen=LATENCY_WINDOW)

    def record(self, op: str | None, code: str | None, latency_s: float | None = None) -> None:
        self.by_op[op or "unreadable"] += 1
        if code is None:
            self.ok += 1
        else:
            self.error += 1
            self.by_code[code] += 1
        if latency_s is not None:
            self._latency.append(latency_s * 1000)

    def requests(self) -> dict:
        return {"ok": self.ok, "error": self.error, "by_error_code": dict(self.by_code),
                "by_op": dict(self.by_op)}

    def latency_ms(self) -> dict:
        ordered = sorted(self._latency)
        return {"p50": _percentile(ordered, 0.50), "p99": _percentile(ordered, 0.99), "samples": len(ordered)}


def _percentile(ordered: list, q: float) -> float:
    if not ordered:
        return 0.0
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def merge_batching(per_worker: list[dict], max_batch_size: int, max_packed_tokens: int) -> dict:
    """Sum the engines' batching statistics across workers."""
    histogram: Counter = Counter()
    batches = requests = 0
    for stats in per_worker:
        batches += stats.get("batches", 0)
        requests += stats.get("requests", 0)
        histogram.update({k: v for k, v in stats.get("batch_size_histogram", {}).items()})
    return {
        "max_batch_size": max_batch_size,
        "max_packed_tokens": max_packed_tokens,
        "batches": batches,
        "requests": requests,
        "mean_batch_size": round(requests / batches, 3) if batches else 0.0,
        "batch_size_histogram": dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
    }
