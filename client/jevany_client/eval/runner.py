"""Sending the suite: N requests in flight over one AsyncJevClient, each answer written as it arrives.

Which outcomes are final:
- an answer is (it is written, after the client's self-check of each
  answer: one that fails it is written as the error `invalid_answer`);
- an error the protocol calls not retryable (invalid_request,
  context_length_exceeded, unknown_model, unsupported_media, internal, ...)
  is: the same request would fail the same way again, so it is written and
  counted in the report;
- a retryable error (overloaded, deadline_exceeded, shutting_down,
  worker_lost), the client's own timeout and "no daemon there" are not: they
  say nothing about the item, only about the daemon at that moment (busy,
  restarting, gone). The item is tried again after a pause that doubles
  from RETRY_FIRST_S to RETRY_MAX_S, and is never written as a wrong answer.

If no item has finished for `patience` seconds while items keep failing
retryably, the run stops and leaves them undone: a rerun picks them up.
Ctrl-C or SIGTERM stops at once in the same way: the calls in flight are
cancelled (their late replies are discarded by the client) and everything
already written stays.

The run's rate (RunSummary.rate), which the progress bar and the printed
summary both show: items given a final outcome by this run over the seconds
from its first request to its last outcome. A private daemon's loading, the
first ping and the report are not in it; a run that finished nothing has no
rate.
"""

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import JevanyError
from .results import ResultsLog, answer_record, error_record
from .suite import Item

RETRY_FIRST_S = 0.1
RETRY_MAX_S = 2.0


@dataclass
class RunSummary:
    finished: int = 0                                    # items given a final outcome by this run
    errors: Counter = field(default_factory=Counter)     # final error codes written by this run
    retried: Counter = field(default_factory=Counter)    # retryable failures, tried again
    left: int = 0                                        # items still not done when the run stopped
    stopped: str | None = None                           # why the run stopped before the end
    sending_since: float | None = None                   # time.monotonic() of the first request
    last_outcome_at: float | None = None                 # time.monotonic() of the last final outcome

    def sending_s(self) -> float | None:
        """Seconds from the first request to the last outcome; None before the first outcome."""
        if self.sending_since is None or self.last_outcome_at is None:
            return None
        return self.last_outcome_at - self.sending_since

    def rate(self) -> float | None:
        """Items finished by this run per second of sending (see above); None if it finished none."""
        seconds = self.sending_s()
        if not self.finished or seconds is None:
            return None
        return self.finished / max(seconds, 1e-6)


def rate_text(rate: float | None) -> str:
    """A rate as the bar and the summary both write it."""
    return "-- items/s" if rate is None else f"{rate:,.1f} items/s"


class _GiveUp(Exception):
    pass


class Runner:
    """One pass over the items still to do.

    on_change(summary) is called after every outcome, for a progress display.
    """

    def __init__(self, client, log: ResultsLog, *, concurrency: int, patience: float,
                 on_change: Callable[[RunSummary], None] = lambda summary: None):
        self.client = client
        self.log = log
        self.concurrency = concurrency
        self.patience = patience
        self.on_change = on_change
        self.summary = RunSummary()
        self._last_progress = time.monotonic()

    async def run(self, todo: list[Item]) -> RunSummary:
        pending = iter(todo)
        self.summary.sending_since = time.monotonic()
        workers = [asyncio.ensure_future(self._work(pending)) for _ in range(min(self.concurrency, len(todo)))]
        try:
            await asyncio.gather(*workers)
        except _GiveUp as stop:
            self.summary.stopped = str(stop)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self.summary.left = sum(1 for item in todo if item.index not in self.log.done)
        return self.summary

    async def _work(self, pending) -> None:
        for item in pending:
            await self._settle(item)

    async def _settle(self, item: Item) -> None:
        """Ask until the item has a final outcome, then write it."""
        for attempt in itertools.count():
            try:
                result = await self.client.decide_request(item.body)
            except JevanyError as err:
                if not err.retryable:
                    self.summary.errors[err.code] += 1
                    self._write(error_record(item, err.code, err.message))
                    return
                self.summary.retried[err.code] += 1
                self.on_change(self.summary)
                self._check_patience(err)
                await asyncio.sleep(min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** min(attempt, 8)))
                continue
            record = answer_record(item, result)
            if "error" in record:
                self.summary.errors[record["error"]["code"]] += 1
            self._write(record)
            return

    def _write(self, record: dict) -> None:
        # One synchronous write between awaits: a cancellation can never split a line.
        self.log.append(record)
        self.summary.finished += 1
        self._last_progress = self.summary.last_outcome_at = time.monotonic()
        self.on_change(self.summary)

    def _check_patience(self, err: JevanyError) -> None:
        idle = time.monotonic() - self._last_progress
        if idle > self.patience:
            raise _GiveUp(f"no item finished for {idle:.0f}s (--patience {self.patience:g}); "
                          f"the last failure: {err.code}: {err.message}")
