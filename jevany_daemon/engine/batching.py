"""Group commit: which queued requests share a forward pass, and who runs it.

There is no timer anywhere. Whoever frees the model takes what is queued, so
an idle engine scores a lone request at once and a busy one fills batches
from what arrived during the last pass. This module knows nothing about
models; it sees each request only as its shape under the active layout.
"""
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

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
    stem: Any = None      # requests on one stem in a pass make one packed row, as wide as all of them
    shared: int = 0       # the stem's tokens to compute, which that row holds once
    tails: int = 0        # what the request adds to that row after the stem: its questions
    outcome: Any = None   # the result, or the JevanyError the request ended with
    done: bool = False


def own_tokens(rows: int, width: int) -> int:
    return rows * width


@dataclass(frozen=True)
class BatchLimits:
    max_size: int
    max_padded_tokens: int
    max_padding_waste: float
    # Padded tokens of a pass of rows x width: its own, or with a shape plan its bucket's (ShapePlan.tokens)
    price: Callable[[int, int], int] = own_tokens


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
    cost = _Cost(head, limits.price)   # padded_cost(batch), kept as running sums: each candidate judged in O(1)
    # (a stem key is hashed in O(1): prefix_reuse.stem_key)
    window = [p for _, p in zip(range(SCAN_LIMIT), queue) if not p.alone and p.group == head.group]
    window.sort(key=lambda p: abs(p.width - head.width))   # stable: arrival order breaks ties
    for p in window:
        if len(batch) == limits.max_size:
            break
        sums = cost.trial(p)
        padded = cost.padded_of(sums, cost.requests + 1)
        if padded > limits.max_padded_tokens:
            continue
        waste, before = 1 - sums.real / padded, 1 - cost.sums.real / cost.padded
        if waste > limits.max_padding_waste and waste > before:
            continue
        batch.append(p)
        cost.add(p, sums)
    taken = set(map(id, batch))
    remaining = [p for p in queue if id(p) not in taken]
    queue.clear()
    queue.extend(remaining)
    return batch


class _Sums(NamedTuple):
    rows: int
    width: int          # the widest row
    prefix: int         # the longest prefix
    real: int
    grown: int = 0      # the width of the last request's stem row, with it

    def padded(self, requests: int, price=own_tokens) -> int:
        return price(self.rows, self.width) + requests * self.prefix


class _Cost:
    """A batch's padded tokens, as running sums: every row padded to the widest, every prefix (one
    row per request) to the longest.

    Requests on one stem (Pending.stem) run as one packed row holding the
    stem once and every one of their questions, so a request joining its
    stem's row adds its questions (Pending.tails) to that row's width, not a
    row of its own: counted by request, 31 requests on one stem with
    200-token questions would look like 31 rows of 200 tokens, where the
    pass has one of 6,200. Requests on one stem carry the same `shared`:
    Engine.take costs queued requests again once the prefix cache has
    changed. A bound, not the pass itself: groups on the same cached rows
    may share a row (pass_inputs.Packing), which this counts as one each.
    """

    def __init__(self, first: Pending, price=own_tokens):
        self.sums, self.requests, self.price = _Sums(0, 0, 0, 0), 0, price
        self.stems: dict = {}       # stem -> the width of its row so far
        self.add(first)

    @property
    def padded(self) -> int:
        return self.sums.padded(self.requests, self.price)

    def padded_of(self, sums: _Sums, requests: int) -> int:
        return sums.padded(requests, self.price)

    def trial(self, p: Pending) -> _Sums:
        """The sums were p to join; nothing changes yet."""
        s = self.sums
        row = self.stems.get(p.stem) if p.stem is not None else None
        if row is None:
            rows, real, grown = s.rows + p.rows, s.real + p.real, p.shared + p.tails
        else:
            # its stem's row, which already holds the stem: one row fewer, the stem's tokens not again
            rows, real, grown = s.rows + p.rows - 1, s.real + p.real - p.shared, row + p.tails
        return _Sums(rows, max(s.width, p.width, grown), max(s.prefix, p.prefix), real, grown)

    def add(self, p: Pending, sums: _Sums | None = None) -> None:
        self.sums = sums or self.trial(p)
        self.requests += 1
        if p.stem is not None:
            self.stems[p.stem] = self.sums.grown


Take = Callable[[deque], list[Pending]]
Run = Callable[[list[Pending]], None]


def padded_cost(batch: list[Pending]) -> int:
    """Tokens the batch's passes allocate (_Cost)."""
    cost = _Cost(batch[0])
    for p in batch[1:]:
        cost.add(p)
    return cost.padded


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
