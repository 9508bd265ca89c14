"""Python's cyclic collector in the worker: how often it ran and how long it took, by generation.

A collection stops the worker's one loop, and its cost grows with the
objects the process keeps: a cache that grows without bound shows here
first, as collections of the oldest generation taking longer. The worker
reports the totals with its statistics (status: each worker's `collector`).
"""
import gc
import time


class CollectorWatch:
    def __init__(self):
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest_s = 0.0
        self._started: float | None = None
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            took, self._started = time.perf_counter() - self._started, None
            generation = min(2, int(info.get("generation", 2)))
            self.collections[generation] += 1
            self.seconds[generation] += took
            self.longest_s = max(self.longest_s, took)

    def close(self) -> None:
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)

    def as_dict(self) -> dict:
        return {"collections": list(self.collections), "seconds": [round(s, 4) for s in self.seconds],
                "longest_ms": round(self.longest_s * 1000, 3)}
