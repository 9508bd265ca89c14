"""The soak, in its 60-second CI form: same checks as the 30-minute `scripts/soak.py`.

Deselect with `-m "not soak"`.
"""
import pytest

from .soak import SoakPlan, print_report, problems, run_soak


@pytest.mark.soak
def test_sixty_seconds_of_moderate_load_grow_neither_memory_nor_descriptors(shared_daemon):
    daemon = shared_daemon
    report = run_soak(daemon.endpoint, daemon.proc.pid, SoakPlan(duration_s=60, warmup_s=20, sample_s=5))
    print_report(report)
    assert problems(report) == []
    # About 10 requests/s offered; at least one a second answered even on a busy CI machine.
    assert report["outcomes"]["decide:ok"] >= 60
    assert len([r for r in report["samples"] if r["t_s"] >= 20]) >= 8
