"""Load without loss, bounded for CI: 8 client processes x 50 mixed requests, batching on.

The full run is `python -m tests.reliability.load --processes 64 --requests 2000`.
"""
import math

from .load import INVALID, LoadPlan, deadline_ms, print_report, problems, run_load, schedule


def test_every_request_gets_exactly_its_own_reply_and_the_serial_answer(shared_daemon, reference):
    daemon = shared_daemon
    plan = LoadPlan(processes=8, requests=50, disconnecting=2)
    report = run_load(daemon.endpoint, plan, reference)
    print_report(report)
    assert problems(report) == []
    # The mix really was mixed, and it really ran through the batcher.
    kinds = {key.split(":")[0] for key in report["outcomes"]}
    assert {"valid", "deadline"} <= kinds and len(kinds & set(INVALID)) >= 3, report["outcomes"]
    assert report["abandoned"] >= 2
    assert report["parity"]["compared"] >= 300
    assert report["batching"]["requests"] > report["batching"]["batches"], report["batching"]
    # Deadlines are honoured, not only allowed: those of 0 ms must all have expired (problems() checks
    # each), and they are planned often enough that a daemon ignoring timeout_ms cannot slip through.
    must_expire = sum(kind == "deadline" and deadline_ms(rid) == 0
                      for k in range(plan.processes) for rid, kind, _ in schedule(plan, k))
    assert must_expire >= 3
    assert report["outcomes"].get("deadline:deadline_exceeded", 0) >= must_expire - report["abandoned"]


def _clean_report(**parity) -> dict:
    return {"missing": [], "unexpected": [], "wrong": [], "sent": 4, "replies": 4, "abandoned": 0,
            "daemon_counted": 4, "parity": {"compared": 4, "max_abs_diff": 0.0, "decisions_changed": 0} | parity}


def test_the_load_report_fails_on_a_nan_difference():
    assert problems(_clean_report()) == []
    assert problems(_clean_report(max_abs_diff=math.nan))
    assert problems(_clean_report(max_abs_diff=1e-3))
