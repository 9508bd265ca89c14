"""When a worker counts as hung, and how its exit is told (no processes: an injected clock)."""
import signal
from types import SimpleNamespace

import pytest

from jevany_daemon.server import channel
from jevany_daemon.server.workers import BUSY, IDLE, STARTING, STOPPING, WorkerHandle


def handle(state=IDLE, ready=True, returncode=None, **kw) -> WorkerHandle:
    proc = SimpleNamespace(pid=4242, returncode=returncode, poll=lambda: returncode)
    worker = WorkerHandle(0, 1, 0, proc, "cpu", heartbeat_timeout=10.0, batch_timeout=120.0,
                          spawned_at=0.0, last_seen=0.0, state=state, ready_once=ready, **kw)
    return worker


def test_silence_counts_only_once_the_worker_is_ready():
    assert handle(state=STARTING, ready=False).hang_cause(now=600.0, stop_within_s=10) is None   # loading
    assert handle().hang_cause(now=9.9, stop_within_s=10) is None
    assert handle().hang_cause(now=10.5, stop_within_s=10) == "hung: no heartbeat for 10.5s"


def test_a_batch_past_its_deadline_is_a_hang_even_while_heartbeats_come():
    worker = handle(state=BUSY, busy_since=100.0)
    worker.last_seen = 219.0                          # its heartbeat thread is fine
    assert worker.hang_cause(now=219.5, stop_within_s=10) is None
    assert worker.hang_cause(now=220.5, stop_within_s=10) == "hung: batch unanswered after 120.5s"


def test_a_worker_that_ignores_stop_is_a_hang_and_a_killed_one_is_not_judged_again():
    stopping = handle(state=STOPPING, stop_sent_at=50.0)
    stopping.last_seen = 59.0
    assert stopping.hang_cause(now=60.5, stop_within_s=10) == "hung: still running 10s after stop"
    stopping.kill_cause = "hung: still running 10s after stop"
    assert stopping.hang_cause(now=600.0, stop_within_s=10) is None


@pytest.mark.parametrize("returncode,kill_cause,told", [
    (-signal.SIGKILL, None, "killed by SIGKILL"),
    (-signal.SIGSEGV, None, "killed by SIGSEGV"),
    (channel.EXIT_LOAD_FAILED, None, "could not load the model"),
    (1, None, "exit code 1"),
    (-signal.SIGKILL, "hung: no heartbeat for 10.5s", "hung: no heartbeat for 10.5s; killed"),
])
def test_exit_causes(returncode, kill_cause, told):
    worker = handle(returncode=returncode)
    worker.kill_cause = kill_cause
    assert worker.exit_cause() == told


def test_heartbeats_fit_several_times_in_the_timeout():
    assert channel.heartbeat_interval(10.0) == 1.0
    assert channel.heartbeat_interval(1.0) == 0.25
