"""The runner against a scripted client and clock: patience counts from the last outcome, which outcomes
count as errors, and the run's rate."""
import asyncio

import pytest

from jevany_client.answers import shape_answer
from jevany_client.errors import InvalidRequestError, OverloadedError
from jevany_client.eval import runner as runner_module
from jevany_client.eval.results import ResultsLog
from jevany_client.eval.runner import Runner, RunSummary

from .test_eval_metrics import NOUL, suite_items


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Scripted:
    """Each call to decide_request takes the next step of its state's script: (seconds it takes, outcome)."""

    def __init__(self, clock: Clock, scripts: dict[int, list]):
        self.clock, self.scripts = clock, scripts

    async def decide_request(self, body: dict):
        seconds, outcome = self.scripts[body["state"]].pop(0)
        self.clock.t += seconds
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(runner_module.time, "monotonic", clock)

    real_sleep = asyncio.sleep         # runner_module.asyncio is asyncio itself

    async def no_pause(seconds):
        await real_sleep(0)            # the pause's length is test_eval_exits.py's concern
    monkeypatch.setattr(runner_module.asyncio, "sleep", no_pause)
    return clock


def run(tmp_path, client, states, patience: float):
    items = suite_items([{"state": s, "questions": {"u": NOUL}, "labels": {"u": True}} for s in states])
    with ResultsLog(str(tmp_path / "results.jsonl"), items) as log:
        summary = asyncio.run(Runner(client, log, concurrency=1, patience=patience).run(items))
        return summary, dict(log.done)


def test_patience_counts_from_the_last_outcome_not_from_the_start(tmp_path, clock):
    # Item 0 ends at 5 s; item 1 fails at 12 s, 7 s after that outcome: within a patience of 10 s.
    client = Scripted(clock, {0: [(5, InvalidRequestError("final"))],
                              1: [(7, OverloadedError("busy")), (1, InvalidRequestError("final"))]})
    summary, done = run(tmp_path, client, [0, 1], patience=10)
    assert summary.stopped is None and sorted(done) == [0, 1] and summary.left == 0


def test_a_run_stops_once_nothing_finished_for_longer_than_patience(tmp_path, clock):
    client = Scripted(clock, {0: [(5, InvalidRequestError("final"))],
                              1: [(4, OverloadedError("busy"))] * 3 + [(1, InvalidRequestError("final"))]})
    summary, done = run(tmp_path, client, [0, 1], patience=10)
    assert summary.stopped.startswith("no item finished for 12s (--patience 10)")
    assert sorted(done) == [0] and summary.left == 1 and summary.retried == {"overloaded": 3}


def test_final_errors_and_answers_failing_the_self_check_are_counted_as_errors(tmp_path, clock):
    question = suite_items([{"state": 2, "questions": {"u": NOUL}, "labels": {"u": True}}])[0].request.questions[0]
    good = {"answers": {"u": shape_answer(question, [0.25, 0.75])}}
    client = Scripted(clock, {0: [(1, {"answers": {}})], 1: [(1, InvalidRequestError("no"))], 2: [(1, good)]})
    summary, done = run(tmp_path, client, [0, 1, 2], patience=10)
    assert summary.errors == {"invalid_answer": 1, "invalid_request": 1}
    assert summary.finished == 3 and "result" in done[2], done[2]


def test_the_rate_is_items_over_the_seconds_of_sending():
    assert RunSummary(finished=6, sending_since=10.0, last_outcome_at=13.0).rate() == 2.0
    assert RunSummary(finished=0, sending_since=10.0, last_outcome_at=13.0).rate() is None
    assert RunSummary(finished=1, sending_since=10.0).rate() is None
    assert RunSummary(finished=2, sending_since=10.0, last_outcome_at=10.0).rate() == pytest.approx(2e6)
