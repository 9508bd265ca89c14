"""Group commit: which queued requests share a forward pass, and who runs it.

There is no timer anywhere. Whoever frees the model takes what is queued, so
an idle engine scores a lone request at once and a busy one fills batches
from what arrived during the last pass. This module knows nothing about
models; it sees each request only as its shape under the active layout.
"""
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from jevany_client.errors import InternalError

# How far into the queue batch selection looks for similar-length requests.
SCAN_LIMIT = 1024


@dataclass(eq=False)
class Pending:
    item: Any             # what the runner scores
    rows: int             # rows this request occupies in a batch
    width: int            # its longest row
    real: int             # its real (unpadded) tokens
    alone: bool = False   # must run in a batch of its own
    prefix: int = 0       # a shared prefix run in a pass of its own (shared layout), one row per request
    group: str = ""       # requests share a pass only within one group (the layout that runs them)
    outcome: Any = None   # the result, or the JevanyError the request ended with
    done: bool = False


@dataclass(frozen=True)
class BatchLimits:
    max_size: int
    max_padded_tokens: int
    max_padding_waste: float


def take_batch(queue: deque, limits: BatchLimits) -> list[Pending]:
    """Pop the oldest request plus the queued ones that pad least alongside it.

    The oldest always goes, so nothing starves. Others join closest width
    first while the batch stays within the size and padded-token limits, and
    while padding stays under the waste cap (or the join adds no waste).
    """
    head = queue.popleft()
    batch = [head]
    if head.alone or limits.max_size == 1 or not queue:
        return batch
    real = head.real
    # padded_cost(batch), kept as running sums and maxima: each candidate is judged in O(1)
    rows, width, prefix = head.rows, head.width, head.prefix
    window = [p for _, p in zip(range(SCAN_LIMIT), queue) if not p.alone and p.group == head.group]
    window.sort(key=lambda p: abs(p.width - head.width))   # stable: arrival order breaks ties
    for p in window:
        if len(batch) == limits.max_size:
            break
        joined = (rows + p.rows, max(width, p.width), max(prefix, p.prefix))
        cost = _padded(*joined, len(batch) + 1)
        if cost > limits.max_padded_tokens:
            continue
        waste, before = 1 - (real + p.real) / cost, 1 - real / _padded(rows, width, prefix, len(batch))
        if waste > limits.max_padding_waste and waste > before:
            continue
        batch.append(p)
        real += p.real
        rows, width, prefix = joined
    taken = set(map(id, batch))
    remaining = [p for p in queue if id(p) not in taken]
    queue.clear()
    queue.extend(remaining)
    return batch


Take = Callable[[deque], list[Pending]]
Run = Callable[[list[Pending]], None]


def padded_cost(batch: list[Pending]) -> int:
    """Tokens the batch's passes allocate: every row padded to the widest, every prefix to the longest."""
    return _padded(sum(p.rows for p in batch), max(p.width for p in batch), max(p.prefix for p in batch), len(batch))


def _padded(rows: int, width: int, prefix: int, requests: int) -> int:
    return rows * width + requests * prefix


def drain(queue: deque, take: Take, run: Run) -> None:
    """Score everything in ``queue`` batch by batch (the daemon worker's path)."""
    while queue:
        _run_all(run, take(queue))


def _run_all(run: Run, batch: list[Pending]) -> None:
    try:
        run(batch)
    finally:
        # A runner that broke its promise must not leave callers waiting forever.
        for p in batch:
            if not p.done:
                p.outcome, p.done = InternalError("request was not scored"), True


class GroupCommit:
    """In-process group commit across caller threads.

    A caller queues its request, then either waits for a pass in flight or,
    when the model is free, becomes the runner for everything queued. Callers
    whose request finished are woken as soon as the pass ends.
    """

    def __init__(self, take: Take, run: Run):
        self._take = take
        self._run = run
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._busy = False

    def submit(self, pending: Pending) -> Pending:
        with self._cond:
            self._queue.append(pending)
            while not pending.done:
                if self._busy:
                    self._cond.wait()
                    continue
                batch = self._take(self._queue)
                self._busy = True
                self._cond.release()
                try:
                    _run_all(self._run, batch)
                finally:
                    self._cond.acquire()
                    self._busy = False
                    self._cond.notify_all()
        return pending
