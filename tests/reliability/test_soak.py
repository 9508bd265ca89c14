"""The soak, in its 60-second CI form: same checks as the 30-minute `scripts/soak.py`.

Deselect with `-m "not soak"`.
"""
import pytest

from .soak import SoakPlan, print_report, problems, run_soak, summarize


@pytest.mark.soak
def test_sixty_seconds_of_moderate_load_grow_neither_memory_nor_descriptors(shared_daemon):
    daemon = shared_daemon
    report = run_soak(daemon.endpoint, daemon.proc.pid, SoakPlan(duration_s=60, warmup_s=20, sample_s=5))
    print_report(report)
    assert problems(report) == []
    # About 10 requests/s offered; at least one a second answered even on a busy CI machine.
    assert report["outcomes"]["decide:ok"] >= 60
    assert len([r for r in report["samples"] if r["t_s"] >= 20]) >= 8


def _report(supervisor_fds: list[int]) -> dict:
    rows = [{"t_s": 20.0 + 5 * i, "worker_pid": 7, "supervisor_rss_kb": 1000, "supervisor_fds": n,
             "worker_rss_kb": 1000, "worker_fds": 30} for i, n in enumerate(supervisor_fds)]
    return summarize(SoakPlan(), rows, [{"outcomes": {"decide:ok": 1}, "latency": {}, "wrong": []}])


def test_a_descriptor_open_for_one_sample_is_no_leak_but_a_rising_floor_is():
    assert problems(_report([24, 24, 25, 24, 24, 26, 24, 24, 24])) == []      # a listing caught mid-read
    assert problems(_report([24, 24, 24, 24, 24, 24, 24, 24, 26])) == []      # even the last sample
    [found] = problems(_report([24, 24, 24, 24, 25, 25, 25, 25, 25]))          # one held for good
    assert found.startswith("supervisor file descriptors grew") and "'floor_last': 25" in found
    assert problems(_report([24, 25, 26, 27, 28, 29, 30, 31, 32])) != []
