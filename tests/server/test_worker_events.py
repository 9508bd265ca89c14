"""Worker events as the supervisor takes them: answers, readiness, and a worker's exit (no processes: fake
worker processes, a recording pool)."""
from types import SimpleNamespace

import pytest

from jevany_daemon import channel
from jevany_daemon.server.cache_clears import CacheClears
from jevany_daemon.server.gather import Gather
from jevany_daemon.server.metrics import Metrics
from jevany_daemon.server.request_queue import Entry
from jevany_daemon.server.run_state import RunState
from jevany_daemon.server.settings import ServeSettings
from jevany_daemon.server.status import Counters
from jevany_daemon.server.worker_events import MAX_FAILED_STARTS, WorkerEvents
from jevany_daemon.server.worker_handle import BUSY, IDLE, STARTING, WorkerHandle

MODEL = {"id": "tiny", "source": "/m", "readout": "pointer", "layout": "packed", "device": "cpu", "dtype": "fp32"}


class Pool:
    """The serving generation is everything; replace records what it was asked to start."""

    def __init__(self, *workers):
        self.workers, self.gone_stats, self.replaced = list(workers), {}, []

    def serving(self):
        return list(self.workers)

    def role(self, worker):
        return "serving"

    def remove(self, worker):
        self.workers.remove(worker)

    def replace(self, dead, settings):
        self.replaced.append(dead.slot)
        return SimpleNamespace(restarts=dead.restarts + 1, pid=1)


class Notifier:
    def __init__(self):
        self.readied = []

    def ready(self, status):
        self.readied.append(status)


def worker(slot=0, state=IDLE, ready=True, returncode=None, **kw) -> WorkerHandle:
    proc = SimpleNamespace(pid=4000 + slot, returncode=returncode, poll=lambda: returncode)
    return WorkerHandle(slot, slot + 1, 0, proc, "cpu", heartbeat_timeout=10.0, batch_timeout=120.0, spawned_at=0.0,
                        state=state, ready_once=ready, **kw)


def events_for(pool, run_state=None, **parts):
    failed = []
    given = dict(pool=pool, run_state=run_state or RunState(0.0), settings=ServeSettings, clock=lambda: 3.0,
                 gather=Gather(), counters=Counters(), metrics=Metrics(), notifier=Notifier(),
                 status_line=lambda: "up", replies=None, clears=CacheClears(), reloads=None,
                 fail=lambda message, exit_code: failed.append((message, exit_code)))
    events = WorkerEvents(**{**given, **parts})
    return events, failed


def entries(*tags):
    return [Entry(tag, None, [b"client"], f"r{tag}", b"", 0.0, None) for tag in tags]


class Backend:
    def send_multipart(self, frames):
        pass


def test_results_for_the_last_hand_over_leave_the_worker_idle_and_tell_whom_it_skipped():
    w = worker()
    events, _ = events_for(Pool(w))
    w.hand_over(Backend(), entries(1, 2), now=1.0)
    events.on_results(w, [[1, True, {"ok": 1}]], {}, [], 1)
    assert w.state == IDLE and not w.inflight
    assert [(e.tag, ok) for e, ok, _ in events.take_answered()] == [(1, True), (2, False)]


def test_an_early_answer_restarts_the_batch_clock_and_keeps_the_worker_busy():
    w = worker()
    events, _ = events_for(Pool(w))
    w.hand_over(Backend(), entries(1, 2), now=1.0)
    events.on_early(w, [[1, True, {"ok": 1}]], {}, [])
    assert w.state == BUSY and w.busy_since == 3.0 and list(w.inflight) == [2]


def test_the_daemon_is_ready_only_once_every_serving_worker_has_loaded():
    first, second = worker(0, state=STARTING, ready=False), worker(1, state=STARTING, ready=False)
    notifier, run_state = Notifier(), RunState(0.0)
    events, _ = events_for(Pool(first, second), run_state=run_state, notifier=notifier)
    events.on_ready(first, {"model": MODEL, "pid": 1})
    assert run_state.state == "starting" and notifier.readied == []
    events.on_ready(second, {"model": MODEL, "pid": 2})
    assert run_state.state == "ready" and notifier.readied == ["up"]


def _exit(w, run_state=None):
    pool, metrics = Pool(w), Metrics()
    events, failed = events_for(pool, run_state=run_state, metrics=metrics,
                                replies=SimpleNamespace(cleared=lambda done: None, reply_error=None))
    events.on_exit(w)
    died = metrics.registry.get_sample_value("jevany_worker_restarts_total", {"cause": "died"})
    hung = metrics.registry.get_sample_value("jevany_worker_restarts_total", {"cause": "hung"})
    return pool.replaced, failed, (died, hung)


def _serving():
    run_state = RunState(0.0)
    run_state.ready()
    return run_state


def test_a_serving_worker_that_dies_is_replaced_and_counted_by_cause():
    assert _exit(worker(returncode=-9), _serving()) == ([0], [], (1, 0))
    hung = worker(returncode=-9, kill_cause="hung: no heartbeat for 11.0s")
    assert _exit(hung, _serving()) == ([0], [], (0, 1))


def test_a_slots_replacements_that_keep_dying_before_loading_stop_the_daemon_at_the_limit():
    below = worker(ready=False, state=STARTING, returncode=1, failed_starts=MAX_FAILED_STARTS - 2)
    assert _exit(below, _serving())[:2] == ([0], [])
    at = worker(ready=False, state=STARTING, returncode=1, failed_starts=MAX_FAILED_STARTS - 1)
    replaced, failed, _ = _exit(at, _serving())
    assert replaced == [] and failed == [("worker 0 exited before loading the model (exit code 1)", 1)]


@pytest.mark.parametrize("code, exit_code", [(channel.EXIT_SETTINGS, 2), (channel.EXIT_LOAD_FAILED, 1)])
def test_a_first_worker_that_cannot_load_stops_the_daemon_with_its_exit_status(code, exit_code):
    replaced, failed, _ = _exit(worker(ready=False, state=STARTING, returncode=code))
    assert replaced == [] and [status for _, status in failed] == [exit_code]
