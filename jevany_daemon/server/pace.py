"""Pace: how fast each worker scores, against its own best, so that one slowing down by itself is seen.

A pass's cost follows its shape, so a worker's passes are compared only with
its own passes of the same shape class (rows and padded tokens, each by
powers of two), in milliseconds per padded token. Per class, the pace is the
median of the passes of the last WINDOW_S, once there are MIN_PASSES of
them; the baseline is the best pace the class has held. The worker's ratio
is the median, over its passes of the window, of their class's pace over
its baseline: 1.0 at its best, 3.0 three times slower.

A worker whose ratio stays at SLOW_RATIO or more for SLOW_FOR_S is slow:
said once in the log (worker_slow; worker_pace_recovered when it is no
longer), in status (each worker's `pace`) and in the metrics. The supervisor
may then replace it as a reload does (--replace-slow-workers): the new
worker loads beside it and the slow one finishes what it holds, so no
request is lost. That is worth a model load only for a worker slow on its
own account; a slow host slows its successor too, so it is done at most once
per REPLACE_EVERY_S.

The best pace is a low bar to hold against: a worker measured only under a
light load, then loaded hard on a busy host, can pass 2x without being sick.
So the threshold is a doubling held for a minute, far above a window's
noise, and replacing stays the operator's choice.
"""
import logging
import statistics
from collections import deque

from jevany_daemon.channel import PassRecord
from jevany_daemon.logs import event

log = logging.getLogger("jevany.supervisor")

WINDOW_S = 30.0         # the passes a class's pace is the median of
MIN_PASSES = 8          # in a window, before its median counts as the class's pace
MAX_KEPT = 512          # passes kept per class (the newest), however fast they come
SLOW_RATIO = 2.0        # the ratio at which a worker counts as slowing down
SLOW_FOR_S = 60.0       # held this long, it is slow
REPLACE_EVERY_S = 600.0  # the least time between two replacements for pace
CHECK_EVERY_S = 1.0     # how often the supervisor checks its workers' paces


def shape_class(rows: int, padded_tokens: int) -> tuple[int, int]:
    return max(1, rows).bit_length(), max(1, padded_tokens).bit_length()


class Pace:
    """One worker's passes by shape class: their recent pace, its best, and since when it has been slow."""

    def __init__(self):
        self.recent: dict[tuple, deque] = {}     # class -> deque[(at, ms per padded token)]
        self.best: dict[tuple, float] = {}       # class -> the lowest pace it has held
        self.ratio: float | None = None          # at the last check; None: no class measured yet
        self.slowing_since: float | None = None  # since when the ratio has been at SLOW_RATIO or more
        self.slow = False                        # held SLOW_FOR_S: said, and maybe replaced

    def passes(self, records: list, at: float) -> None:
        """A worker's passes (channel.PassRecord) that ran whole; a failed one says nothing of its pace."""
        for record in map(PassRecord.read, records):
            if record.ok and record.size >= 1 and record.padded_tokens >= 1 and record.latency_ms > 0:
                kept = self.recent.setdefault(shape_class(record.size, record.padded_tokens),
                                              deque(maxlen=MAX_KEPT))
                kept.append((at, record.latency_ms / record.padded_tokens))

    def check(self, now: float) -> str | None:
        """Update the ratio; "slow" the moment the worker becomes slow, "recovered" when it stops being."""
        ratios = []
        for key, kept in self.recent.items():
            while kept and now - kept[0][0] > WINDOW_S:
                kept.popleft()
            if len(kept) < MIN_PASSES:
                continue
            pace = statistics.median(ms for _, ms in kept)
            best = self.best[key] = min(self.best.get(key, pace), pace)
            ratios += [pace / best] * len(kept)
        self.ratio = statistics.median(ratios) if ratios else None
        if self.ratio is None or self.ratio < SLOW_RATIO:
            self.slowing_since = None
            if self.slow:
                self.slow = False
                return "recovered"
            return None
        if self.slowing_since is None:
            self.slowing_since = now
        if not self.slow and now - self.slowing_since >= SLOW_FOR_S:
            self.slow = True
            return "slow"
        return None

    def describe(self) -> dict:
        return {"ratio": None if self.ratio is None else round(self.ratio, 3), "slow": self.slow}


class PaceWatch:
    """The supervisor's check of its serving workers' paces, every CHECK_EVERY_S: said in the log and the
    metrics; the cause of a replacement when one is due and the operator allows it."""

    def __init__(self, metrics):
        self.metrics = metrics
        self.next_check = 0.0
        self.replaced_at: float | None = None

    def check(self, workers: list, now: float, may_replace: bool) -> str | None:
        """The reload's cause when a slow worker is to be replaced now; else None."""
        if now < self.next_check:
            return None
        self.next_check = now + CHECK_EVERY_S
        cause = None
        for worker in workers:
            pace = worker.pace
            change = pace.check(now)
            self.metrics.pace(worker.slot, pace.ratio)
            if change == "slow":
                self.metrics.slow_workers.inc()
                event(log, "worker_slow", level=logging.WARNING, index=worker.slot, pid=worker.pid,
                      ratio=round(pace.ratio, 2), for_s=SLOW_FOR_S, replacing=may_replace)
            elif change == "recovered":
                event(log, "worker_pace_recovered", index=worker.slot, pid=worker.pid, ratio=round(pace.ratio or 0, 2))
            if pace.slow and cause is None and may_replace and (
                    self.replaced_at is None or now - self.replaced_at >= REPLACE_EVERY_S):
                cause = f"worker {worker.slot} slow: {pace.ratio:.1f}x its own best pace for {SLOW_FOR_S:g} s or more"
        if cause is not None:
            self.replaced_at = now
        return cause
