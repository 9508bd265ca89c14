"""Reload (control op and SIGHUP): fresh workers take over once ready; no request fails because of it."""
import multiprocessing as mp
import signal
from collections import Counter

import pytest

from jevany_client import InternalError
from jevany_daemon import workloads

from .client_proc import until_stopped
from .daemons import wait_for

N_CLIENTS = 2
PAUSE_S = 0.01     # each client about 100 requests/s at most: load, with cores left to load the new model


def scored(daemon, generation=None) -> int:
    """Requests scored, by every worker so far or by one generation's workers."""
    status = daemon.status()
    if generation is None:
        return status["batching"]["requests"]
    return sum(w["requests"] for w in status["workers"] if w["generation"] == generation)


def write_config(path, model, model_id):
    path.write_text(f'model = "{model}"\nmodel_id = "{model_id}"\nworkers = 2\nmax_batch_size = 4\n')


def test_reload_under_load_switches_model_and_fails_nothing(start_daemon, tiny_model, tmp_path):
    config = tmp_path / "jevany.toml"
    model_b = tiny_model("qwen3", "choice")       # built now, not while the clients wait
    write_config(config, tiny_model("qwen3", "pointer"), "model-a")
    daemon = start_daemon("--config", str(config), model=None)
    ctx = mp.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    bodies = workloads.short(16, seed=11)
    procs = [ctx.Process(target=until_stopped, args=(daemon.endpoint, bodies, f"c{k}", stop, queue, PAUSE_S))
             for k in range(N_CLIENTS)]
    for p in procs:
        p.start()
    try:
        wait_for(lambda: scored(daemon) >= 10, 60, "clients under way")
        write_config(config, model_b, "model-b")
        with daemon.control_client(timeout=120) as control:
            reply = control.reload()
        assert reply["reloaded"] is True and reply["model"] == "model-b" and reply["workers"] == 2
        assert reply["needs_restart"] == []
        wait_for(lambda: scored(daemon, generation=1) >= 10, 60, "clients served by model-b")
    finally:
        stop.set()
    outcomes, models = Counter(), Counter()
    for _ in procs:
        _name, seen = queue.get(timeout=120)
        for outcome, detail in seen:
            outcomes[outcome] += 1
            models[detail if outcome == "ok" else "-"] += 1
    for p in procs:
        p.join(30)
    print(f"\nreload under load: outcomes {dict(outcomes)}, answered by {dict(models)}")
    assert set(outcomes) == {"ok"}                               # nothing failed because of a reload
    assert models["model-a"] >= 10 and models["model-b"] >= 10
    wait_for(lambda: len(daemon.workers()) == 2, 60, "the old workers gone")
    status = daemon.status()
    assert status["reload"]["serving_generation"] == 1
    assert [(w["generation"], w["role"]) for w in status["workers"]] == [(1, "serving"), (1, "serving")]
    assert status["requests"]["error"] == 0 and status["model"]["id"] == "model-b"
    log = daemon.log.read_text()
    assert log.count("event=reload_done") == 1 and log.count("event=worker_stopped") == 2
    assert "event=worker_exit" not in log
    assert daemon.stop() == 0


def test_a_reload_that_cannot_load_keeps_the_old_model_then_sighup_reloads(start_daemon, tiny_model, tmp_path):
    config = tmp_path / "jevany.toml"
    config.write_text(f'model = "{tiny_model("qwen3", "pointer")}"\nmodel_id = "model-a"\n')
    daemon = start_daemon("--config", str(config), model=None)
    config.write_text(f'model = "{tmp_path / "missing"}"\n')
    with daemon.control_client(timeout=120) as control:      # a settings error: no worker is started
        with pytest.raises(InternalError, match=r"reload refused: --config .*: model does not exist"):
            control.reload()
    (tmp_path / "empty").mkdir()
    config.write_text(f'model = "{tmp_path / "empty"}"\n')  # there, but no model in it: the workers fail
    with daemon.control_client(timeout=120) as control:
        with pytest.raises(InternalError, match=r"(?s)reload failed: .*cannot load.*still serving model-a"):
            control.reload()
    config.write_text("max_bath_size = 3\n")
    with daemon.control_client(timeout=120) as control:
        with pytest.raises(InternalError, match="reload refused: .*unknown settings"):
            control.reload()
    with daemon.client(timeout=60) as client:
        assert client.call("decide", workloads.short(1, seed=1)[0])["model"] == "model-a"
    status = daemon.status()
    assert status["state"] == "ready" and status["reload"]["last"]["reloaded"] is False
    assert len(status["workers"]) == 1 and status["workers"][0]["generation"] == 0
    config.write_text(f'model = "{tiny_model("qwen3", "pointer")}"\nmodel_id = "model-c"\nmax_queue = 5\n')
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: daemon.status()["model"]["id"] == "model-c", 120, "the SIGHUP reload")
    status = daemon.status()
    assert status["reload"]["last"]["needs_restart"] == ["max_queue"] and status["queue"]["max_depth"] == 1024
    log = daemon.log.read_text()
    assert "event=reload cause=SIGHUP" in log and "needs_restart=max_queue" in log
    assert "event=reload_failed" in log and "event=reload_refused" in log
    assert daemon.stop() == 0


# --- the reload's own logic, without processes: a pool that records, workers the test makes ready ---------

class _Pool:
    def __init__(self):
        self.workers, self.serving_generation, self.gone_stats = [], 0, {}

    def start_generation(self, settings):
        from types import SimpleNamespace

        model = {"id": "next", "source": "/m", "readout": "pointer", "layout": "packed", "device": "cpu"}
        self.workers += [SimpleNamespace(generation=1, ready_once=False, model=model, device="cpu", stats={})
                         for _ in range(settings.worker_count)]
        return 1

    def switch_to(self, generation):
        self.serving_generation = generation

    def serving(self):
        return [w for w in self.workers if w.generation == self.serving_generation]

    def retiring(self):
        return [w for w in self.workers if w.generation < self.serving_generation]


def _reloads(run_state):
    from types import SimpleNamespace

    from jevany_daemon.server.metrics import Metrics
    from jevany_daemon.server.reload import Reloads
    from jevany_daemon.server.settings import ServeSettings

    sent = []
    replies = SimpleNamespace(record=lambda op, code: None, send=lambda sock, envelope, reply: sent.append(reply))
    notifier = SimpleNamespace(reloading=lambda usec: None, ready=lambda status: None)
    reloads = Reloads(fresh_settings=lambda: ServeSettings(workers=2), settings=lambda: ServeSettings(workers=2),
                      run_state=run_state, pool=_Pool(), zap=None, clock=lambda: 0.0, notifier=notifier,
                      metrics=Metrics(), replies=replies, status_line=lambda: "up")
    return reloads, sent


def test_a_reload_switches_once_every_new_worker_is_ready_and_answers_every_asker():
    from jevany_daemon.server.run_state import RunState

    run_state = RunState(0.0)
    run_state.ready()
    reloads, sent = _reloads(run_state)
    reloads.begin("reload op", waiter=("sock", [b"a"], "first"))
    reloads.begin("reload op", waiter=("sock", [b"b"], "second"))    # one at a time: it hears the same end
    first, second = reloads.pool.workers
    first.ready_once = True
    assert reloads.advance() is None and sent == []
    second.ready_once = True
    assert reloads.advance() is not None and reloads.pool.serving_generation == 1
    assert [(r["id"], r["ok"], r["result"]["model"]) for r in sent] == [("first", True, "next"),
                                                                         ("second", True, "next")]


def test_a_draining_daemon_refuses_a_reload_as_shutting_down():
    from jevany_daemon.server.run_state import RunState

    run_state = RunState(0.0)
    run_state.ready()
    run_state.begin_drain(exiting=False)
    reloads, sent = _reloads(run_state)
    reloads.begin("reload op", waiter=("sock", [b"a"], "r"))
    assert reloads.current is None and reloads.pool.workers == []
    assert [(r["id"], r["error"]["code"]) for r in sent] == [("r", "shutting_down")]


def test_a_replacement_the_daemon_decided_on_keeps_the_serving_settings_and_reads_no_new_ones():
    from jevany_daemon.server.run_state import RunState
    from jevany_daemon.server.settings import SettingsError

    run_state = RunState(0.0)
    run_state.ready()
    reloads, _ = _reloads(run_state)

    def half_edited():
        raise SettingsError("config.toml: a half-edited file")

    reloads.fresh_settings = half_edited
    reloads.begin("worker 0 slow", same_settings=True)
    assert reloads.current is not None and reloads.current.settings == reloads.settings()
    assert reloads.current.needs_restart == [] and len(reloads.pool.workers) == 2
