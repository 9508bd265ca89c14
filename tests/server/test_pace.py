"""A worker's pace against its own best (server/pace.py), on a clock the test moves; the supervisor's
phase that reports it and, where the operator allows, replaces the worker as a reload does."""
from types import SimpleNamespace

from jevany_daemon.channel import PassRecord
from jevany_daemon.server.metrics import Metrics
from jevany_daemon.server.pace import (MIN_PASSES, REPLACE_EVERY_S, SLOW_FOR_S, SLOW_RATIO, WINDOW_S, Pace,
                                       PaceWatch)


def passes(pace: Pace, start: float, seconds: float, ms: float, rows: int = 4, tokens: int = 256,
           every_s: float = 0.5) -> float:
    """One pass of rows x tokens every every_s, each taking ms, from start for seconds; the clock at the end."""
    t = start
    while t < start + seconds:
        pace.passes([list(PassRecord(rows, tokens, tokens, ms, True))], t)
        t += every_s
    return t


def run(pace: Pace, start: float, seconds: float, ms: float, **shape) -> tuple[float, list]:
    """Passes as above with the pace checked once a second (as the supervisor does); what each check said."""
    said, t = [], start
    while t < start + seconds:
        t = passes(pace, t, 1.0, ms, **shape)
        said.append((t, pace.check(t)))
    return t, [(at, what) for at, what in said if what]


def test_a_steady_worker_stays_at_its_best_and_is_never_slow():
    pace = Pace()
    _, said = run(pace, 0.0, 300, 20.0)
    assert said == [] and pace.ratio == 1.0 and not pace.slow


def test_a_worker_twice_as_slow_for_a_minute_is_slow_once_and_recovers_once():
    pace = Pace()
    t, _ = run(pace, 0.0, 120, 20.0)
    began = t
    t, said = run(pace, t, 200, 50.0)
    [(at, what)] = said
    assert what == "slow" and pace.slow and pace.ratio == 2.5
    # the window must first fill with slow passes (half of it), then the ratio is held for SLOW_FOR_S
    assert began + SLOW_FOR_S <= at <= began + WINDOW_S / 2 + SLOW_FOR_S + 2
    t, said = run(pace, t, 60, 20.0)
    assert [what for _, what in said] == ["recovered"] and not pace.slow and pace.ratio == 1.0


def test_a_slowdown_shorter_than_the_minute_is_not_slow():
    pace = Pace()
    t, _ = run(pace, 0.0, 60, 20.0)
    t, said = run(pace, t, SLOW_FOR_S - 10, 60.0)
    t, said2 = run(pace, t, 60, 20.0)
    assert said == said2 == [] and not pace.slow


def test_just_under_the_ratio_is_never_slow():
    pace = Pace()
    t, _ = run(pace, 0.0, 60, 20.0)
    _, said = run(pace, t, 300, 20.0 * SLOW_RATIO * 0.95)
    assert said == [] and 1.8 < pace.ratio < SLOW_RATIO


def test_longer_passes_of_another_shape_are_not_a_slowdown():
    # Bigger passes cost 2.5 times as much per token here; a worker that moves to them is not slower.
    pace = Pace()
    t, _ = run(pace, 0.0, 60, 10.0, rows=2, tokens=128)
    _, said = run(pace, t, 300, 800.0, rows=32, tokens=4096)
    assert said == [] and pace.ratio == 1.0


def test_too_few_passes_in_the_window_say_nothing_and_an_idle_worker_is_not_slow():
    pace = Pace()
    t, _ = run(pace, 0.0, 60, 20.0)
    t, _ = run(pace, t, SLOW_FOR_S - 5, 80.0)
    assert pace.slowing_since is not None
    t += WINDOW_S + 1                         # idle: the window empties
    assert pace.check(t) is None and pace.ratio is None and pace.slowing_since is None
    pace.passes([list(PassRecord(4, 256, 256, 80.0, True))] * (MIN_PASSES - 1), t)
    assert pace.check(t) is None and pace.ratio is None


def test_failed_passes_say_nothing_of_the_pace():
    pace = Pace()
    t, _ = run(pace, 0.0, 60, 20.0)
    for i in range(100):
        pace.passes([list(PassRecord(4, 256, 256, 5000.0, False))], t + i * 0.1)
    assert pace.check(t + 10) is None and pace.ratio == 1.0


def _worker(slot: int) -> SimpleNamespace:
    return SimpleNamespace(slot=slot, pid=1000 + slot, pace=Pace())


def watched(watch: PaceWatch, workers: list, start: float, seconds: float, ms_of, may_replace: bool) -> list:
    """Each worker scores at ms_of(slot); the watch checks as the supervisor's loop does, every 0.25 s."""
    causes, t = [], start
    while t < start + seconds:
        for w in workers:
            passes(w.pace, t, 0.25, ms_of(w.slot), every_s=0.25)
        t += 0.25
        if (cause := watch.check(workers, t, may_replace)) is not None:
            causes.append((t, cause))
    return causes


def sample(metrics: Metrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, labels or None)


def test_the_watch_reports_a_slow_worker_and_replaces_it_only_where_allowed_and_not_too_often():
    metrics = Metrics()
    watch, workers = PaceWatch(metrics), [_worker(0), _worker(1)]
    assert watched(watch, workers, 0.0, 60, lambda slot: 20.0, may_replace=True) == []
    assert sample(metrics, "jevany_worker_pace_ratio", worker="1") == 1.0
    causes = watched(watch, workers, 60.0, 120, lambda slot: 80.0 if slot == 1 else 20.0, may_replace=False)
    assert causes == [] and workers[1].pace.slow and not workers[0].pace.slow
    assert sample(metrics, "jevany_workers_slow_total") == 1.0
    assert sample(metrics, "jevany_worker_pace_ratio", worker="1") == 4.0
    [(at, cause)] = watched(watch, workers, 180.0, 60, lambda slot: 80.0 if slot == 1 else 20.0, may_replace=True)
    assert at == 180.25 and cause.startswith("worker 1 slow: 4.0x its own best pace")
    # still slow (the replacement is loading): not replaced again until REPLACE_EVERY_S has passed
    causes = watched(watch, workers, 240.0, REPLACE_EVERY_S - 61, lambda slot: 80.0 if slot == 1 else 20.0,
                     may_replace=True)
    assert causes == []
    [(again, _)] = watched(watch, workers, 180.0 + REPLACE_EVERY_S - 1, 2, lambda slot: 80.0 if slot == 1 else 20.0,
                           may_replace=True)
    assert again >= 180.25 + REPLACE_EVERY_S
    watched(watch, workers, again, 60, lambda slot: 20.0, may_replace=True)
    assert not workers[1].pace.slow and sample(metrics, "jevany_worker_pace_ratio", worker="1") == 1.0
    assert sample(metrics, "jevany_workers_slow_total") == 1.0      # slow once, recovered once: counted once


def test_the_supervisor_phase_replaces_with_the_serving_settings_only_when_the_operator_allows_it():
    from jevany_daemon.server.run_state import RunState
    from jevany_daemon.server.settings import ServeSettings
    from jevany_daemon.server.supervisor import Supervisor

    slow = _worker(0)
    slow.pace.slow, slow.pace.ratio = True, 3.0
    begun = []
    for allowed, reloading in ((False, None), (True, "a reload running"), (True, None)):
        sup = Supervisor(ServeSettings(replace_slow_workers=allowed), clock=lambda: 100.0, env={})
        sup.run_state = RunState(0.0)
        sup.run_state.ready()
        sup.wiring = SimpleNamespace(pool=SimpleNamespace(serving=lambda: [slow]))
        sup.reloads = SimpleNamespace(current=reloading, begin=lambda cause, **kw: begun.append((cause, kw)))
        sup.pace_watch.check = lambda workers, now, may_replace: "worker 0 slow" if may_replace else None
        sup.watch_pace()
    assert begun == [("worker 0 slow", {"same_settings": True})]
