"""Load without loss, bounded for CI: 8 client processes x 50 mixed requests, batching on.

The full run is `python -m tests.reliability.load --processes 64 --requests 2000`.
"""
from .load import INVALID, LoadPlan, print_report, problems, run_load


def test_every_request_gets_exactly_its_own_reply_and_the_serial_answer(shared_daemon, reference):
    daemon = shared_daemon
    report = run_load(daemon.endpoint, LoadPlan(processes=8, requests=50, disconnecting=2), reference)
    print_report(report)
    assert problems(report) == []
    # The mix really was mixed, and it really ran through the batcher.
    kinds = {key.split(":")[0] for key in report["outcomes"]}
    assert {"valid", "deadline"} <= kinds and len(kinds & set(INVALID)) >= 3, report["outcomes"]
    assert report["abandoned"] >= 2
    assert report["parity"]["compared"] >= 300
    assert report["batching"]["requests"] > report["batching"]["batches"], report["batching"]
