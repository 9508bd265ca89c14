"""When a worker counts as hung, how its exit is told, what it is shown of the GPUs and what it reports
(no processes: an injected clock, a fake Popen)."""
import json
import os
import signal
import time
from types import SimpleNamespace

import pytest

from jevany_daemon import channel
from jevany_daemon.server import worker_handle
from jevany_daemon.server.worker_handle import BUSY, IDLE, MALLOC_DEFAULTS, STARTING, STOPPING, WorkerHandle, worker_launch


def handle(state=IDLE, ready=True, returncode=None, **kw) -> WorkerHandle:
    proc = SimpleNamespace(pid=4242, returncode=returncode, poll=lambda: returncode)
    worker = WorkerHandle(0, 1, 0, proc, "cpu", heartbeat_timeout=10.0, batch_timeout=120.0,
                          spawned_at=0.0, last_seen=0.0, state=state, ready_once=ready, **kw)
    return worker


def test_silence_counts_only_once_the_worker_is_ready():
    assert handle(state=STARTING, ready=False).hang_cause(now=600.0, stop_within_s=10) is None   # loading
    assert handle().hang_cause(now=9.9, stop_within_s=10) is None
    assert handle().hang_cause(now=10.0, stop_within_s=10) is None       # silent for the timeout: not past it
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
    (channel.EXIT_SETTINGS, None, "its settings cannot work here (a shape plan past --warmup-limit)"),
    (1, None, "exit code 1"),
    (0, None, "exit code 0"),
    (-signal.SIGKILL, "hung: no heartbeat for 10.5s", "hung: no heartbeat for 10.5s; killed"),
])
def test_exit_causes(returncode, kill_cause, told):
    worker = handle(returncode=returncode)
    worker.kill_cause = kill_cause
    assert worker.exit_cause() == told


def test_heartbeats_fit_several_times_in_the_timeout():
    assert channel.heartbeat_interval(10.0) == 1.0
    assert channel.heartbeat_interval(1.0) == 0.25


# --- devices: what a worker is shown, and what it reports --------------------------------

def test_a_gpu_worker_is_shown_only_its_gpu_and_calls_it_cuda_0():
    settings = {"device": "cuda:1", "heartbeat_timeout": 10.0, "batch_timeout": 120.0, "model": "/m"}
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "NOTIFY_SOCKET": "/run/systemd/notify", "HOME": "/home/j"}
    argv, worker_env, handed = worker_launch("w0.1", "ipc:///tmp/b", settings, env)
    # systemd's variables stay ours; OpenMP waits passively (worker_handle.py says why)
    assert worker_env == {"CUDA_VISIBLE_DEVICES": "3", "HOME": "/home/j", "OMP_WAIT_POLICY": "PASSIVE",
                          **MALLOC_DEFAULTS}
    assert handed == {**settings, "device": "cuda:0"}
    assert argv[argv.index("--identity") + 1] == "w0.1" and argv[argv.index("--backend") + 1] == "ipc:///tmp/b"


def test_a_device_map_worker_is_shown_every_gpu_of_its_list():
    settings = {"device": "cuda:1,cuda:3", "device_map": "auto", "heartbeat_timeout": 10.0, "batch_timeout": 1.0}
    _, worker_env, handed = worker_launch("w0.1", "ipc:///tmp/b", settings, {})
    assert worker_env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert handed["device"] == "cuda:0,cuda:1"
    _, worker_env, handed = worker_launch("w0.1", "ipc:///tmp/b", {**settings, "device": "cuda"},
                                          {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    assert worker_env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b" and handed["device"] == "cuda"


def test_a_workers_openmp_threads_wait_passively_unless_the_operator_says_otherwise():
    _, worker_env, _ = worker_launch("w0.1", "ipc:///tmp/b", {"device": "cpu"}, {})
    assert worker_env["OMP_WAIT_POLICY"] == "PASSIVE"
    _, worker_env, _ = worker_launch("w0.1", "ipc:///tmp/b", {"device": "cpu"}, {"OMP_WAIT_POLICY": "ACTIVE"})
    assert worker_env["OMP_WAIT_POLICY"] == "ACTIVE"
    # A short spin for workers with cores of their own (docs/OPERATING.md): passive, spinning that long first.
    _, worker_env, _ = worker_launch("w0.1", "ipc:///tmp/b", {"device": "cpu"}, {"GOMP_SPINCOUNT": "1000"})
    assert worker_env["OMP_WAIT_POLICY"] == "PASSIVE" and worker_env["GOMP_SPINCOUNT"] == "1000"


def test_a_worker_keeps_its_passes_memory_unless_the_operator_tunes_malloc():
    _, worker_env, _ = worker_launch("w0.1", "ipc:///tmp/b", {"device": "cpu"}, {})
    assert {k: worker_env[k] for k in MALLOC_DEFAULTS} == {"MALLOC_MMAP_THRESHOLD_": "33554432",
                                                          "MALLOC_TRIM_THRESHOLD_": "1073741824"}
    for theirs in ({"MALLOC_ARENA_MAX": "2"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}):
        _, worker_env, _ = worker_launch("w0.1", "ipc:///tmp/b", {"device": "cpu"}, theirs)
        assert not set(MALLOC_DEFAULTS) & set(worker_env) and set(theirs) <= set(worker_env)
    _, worker_env, _ = worker_launch("w0.1", "ipc:///tmp/b", {"device": "cpu"}, {"GLIBC_TUNABLES": "glibc.rtld.x=1"})
    assert set(MALLOC_DEFAULTS) <= set(worker_env)


def test_a_cpu_worker_sees_no_gpu():
    _, worker_env, handed = worker_launch("w0.1", "ipc:///tmp/b", {"device": "cpu"}, {"CUDA_VISIBLE_DEVICES": "0"})
    assert worker_env["CUDA_VISIBLE_DEVICES"] == "" and handed["device"] == "cpu"


def test_spawn_keeps_the_operators_name_for_the_device(monkeypatch):
    started = []

    def popen(argv, **kwargs):
        [fd] = kwargs["pass_fds"]
        handed = json.loads(os.pread(fd, 1 << 16, 0))     # what the worker will read from its descriptor
        started.append((argv, kwargs["env"], fd, handed))
        return SimpleNamespace(pid=4242, returncode=None, poll=lambda: None)

    monkeypatch.setattr(worker_handle.subprocess, "Popen", popen)
    monkeypatch.setattr(worker_handle, "_pidfd", lambda pid: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    settings = {"device": "cuda:1", "heartbeat_timeout": 10.0, "batch_timeout": 120.0,
                "http_token_file": "/etc/jevany/secret-path"}
    worker = worker_handle.spawn(0, 1, 0, "ipc:///tmp/b", settings, now=0.0)
    [(argv, env, fd, handed)] = started
    assert env["CUDA_VISIBLE_DEVICES"] == "7" and handed == {**settings, "device": "cuda:0"}
    assert worker.device == "cuda:1" and worker.describe("serving")["device"] == "cuda:1"
    # The settings name files: never on the command line, which every local user can read.
    assert argv[argv.index("--settings-fd") + 1] == str(fd) and "--settings" not in argv
    assert not any("secret-path" in arg for arg in argv)
    with pytest.raises(OSError):
        os.fstat(fd)                                      # the supervisor's copy is closed once handed


H200 = {"name": "NVIDIA H200", "memory_used_bytes": 12 << 30, "memory_total_bytes": 140 << 30}


def test_the_device_report_rides_with_hello_and_results():
    worker = handle()
    assert worker.describe("serving")["device_info"] is None              # nothing heard yet
    worker.note_device_info(H200)
    stats = {"batches": 3, "requests": 7, "device_info": {**H200, "memory_used_bytes": 20 << 30}}
    worker.take_stats(stats)
    assert worker.stats == {"batches": 3, "requests": 7}                   # statistics stay statistics
    assert worker.describe("serving")["device_info"]["memory_used_bytes"] == 20 << 30
    worker.take_stats({"batches": 4, "requests": 9})                      # an older worker sends none
    worker.note_device_info(None)
    assert worker.describe("serving")["device_info"]["memory_used_bytes"] == 20 << 30
    assert stats["device_info"]["name"] == "NVIDIA H200"                  # the message itself is left alone


def test_the_collector_totals_ride_with_results_and_stay_out_of_the_statistics():
    worker = handle()
    assert worker.describe("serving")["collector"] is None
    collector = {"collections": [40, 3, 1], "seconds": [0.01, 0.002, 0.03], "longest_ms": 30.0}
    worker.take_stats({"batches": 3, "requests": 7, "collector": collector})
    assert worker.stats == {"batches": 3, "requests": 7}
    worker.take_stats({"batches": 4, "requests": 9})                      # a message without them keeps the last
    assert worker.describe("serving")["collector"] == collector


def worker_events(pool, **parts):
    """WorkerEvents built from the parts the supervisor hands it: real ones, but for the pool a test gives
    and whatever else it passes (parts a test never reaches are None)."""
    from jevany_daemon.server.request_queue import RequestQueue
    from jevany_daemon.server.cache_clears import CacheClears
    from jevany_daemon.server.gather import Gather
    from jevany_daemon.server.metrics import Metrics
    from jevany_daemon.server.run_state import RunState
    from jevany_daemon.server.sdnotify import Notifier
    from jevany_daemon.server.settings import ServeSettings
    from jevany_daemon.server.status import Counters, StatusLine
    from jevany_daemon.server.worker_events import WorkerEvents

    settings, run_state, counters = ServeSettings(), parts.pop("run_state", None) or RunState(0.0), Counters()
    status_line = StatusLine(run_state, pool, RequestQueue(settings.max_queue), counters, time.monotonic)
    given = dict(pool=pool, run_state=run_state, settings=lambda: settings, clock=time.monotonic, gather=Gather(),
                 counters=counters, metrics=Metrics(), notifier=Notifier({}), status_line=status_line,
                 replies=None, clears=CacheClears(), reloads=None, fail=None)
    return WorkerEvents(**{**given, **parts})


def test_the_supervisor_stores_what_workers_report():
    from jevany_daemon.server.run_state import RunState
    from jevany_daemon.server.settings import ServeSettings
    from jevany_daemon.server.status import describe_model

    worker, run_state = handle(state=STARTING, ready=False), RunState(0.0)
    pool = SimpleNamespace(serving=lambda: [worker], workers=[worker], gone_stats={})
    events = worker_events(pool, run_state=run_state)
    model = {"id": "tiny", "source": "/m", "readout": "pointer", "layout": "packed", "device": "cuda:0",
             "dtype": "fp32"}
    events.on_ready(worker, {"pid": 4242, "model": model, "device_info": H200})
    assert worker.device_info == H200 and run_state.state == "ready"
    assert describe_model(pool, ServeSettings())["device"] == "cpu"   # the operator's name, not the worker's own
    events.take_answers(worker, [], {"batches": 1, "device_info": {**H200, "memory_used_bytes": 1}}, [])
    assert worker.device_info["memory_used_bytes"] == 1 and worker.stats == {"batches": 1}


def test_a_worker_whose_supervisor_died_while_it_loaded_exits(tiny_model, tmp_path):
    # The supervisor names itself: a worker that asked for its parent after the parent died
    # would wait, holding its model (and on a GPU, its memory), for ever.
    import subprocess
    import sys

    from jevany_daemon.server.settings import resolve
    from tests.media.test_checker import gone
    from tests.server.daemons import wait_for

    settings = resolve({"model": str(tiny_model("qwen3", "pointer")), "bind": (f"ipc://{tmp_path}/d.sock",),
                        "control": ""}, None, env={}).worker_settings("cpu")
    argv, _, handed = worker_launch("w0.1", f"ipc://{tmp_path}/nobody.sock", settings, {})
    argv += ["--settings", json.dumps(handed)]      # as JSON: started through a parent of its own here
    assert argv[argv.index("--parent") + 1] == str(os.getpid())
    argv[argv.index("--parent") + 1] = "PARENT"
    launch = (f"import os, subprocess, sys; argv = {argv!r}; argv[argv.index('PARENT')] = str(os.getpid()); "
              "p = subprocess.Popen(argv); print(p.pid, flush=True); sys.stdin.read()")
    parent = subprocess.Popen([sys.executable, "-c", launch], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    worker = int(parent.stdout.readline())
    parent.kill()            # while the worker is still importing and loading
    parent.wait(10)
    wait_for(lambda: gone(worker), 120, "the orphaned worker exiting")


class Backend:
    def __init__(self):
        self.sent = []

    def send_multipart(self, frames):
        self.sent.append(channel.decode(frames[1]))


def entries(*tags):
    from jevany_daemon.server.request_queue import Entry

    return [Entry(tag, None, [b"client"], f"r{tag}", b"", 0.0, None) for tag in tags]


def test_hand_overs_are_numbered_and_a_busy_worker_takes_one_more_at_most():
    backend, worker = Backend(), handle(overlaps=True)
    assert worker.available and not worker.can_prefetch
    worker.hand_over(backend, entries(1, 2), now=1.0)
    assert worker.state == BUSY and worker.busy_since == 1.0 and worker.can_prefetch
    worker.hand_over(backend, entries(3), now=2.0)               # the next pass's worth, while busy
    assert worker.busy_since == 1.0 and not worker.can_prefetch  # one pass running, one waiting: enough
    assert [(m[0], [i[0] for i in m[1]], m[2]) for m in backend.sent] == [(channel.BATCH, [1, 2], 1),
                                                                          (channel.BATCH, [3], 2)]


def test_a_worker_whose_host_does_not_overlap_its_device_never_takes_work_ahead():
    # on a CPU the queue keeps what waits, so deadlines and --max-queue hold there to the letter
    backend, worker = Backend(), handle()
    worker.hand_over(backend, entries(1), now=1.0)
    assert worker.state == BUSY and not worker.can_prefetch


def test_a_hand_over_tells_the_worker_how_long_each_request_has_left():
    backend, worker = Backend(), handle(overlaps=True)
    timed, untimed = entries(1, 2)
    timed.deadline = 1.25
    before = time.monotonic()
    worker.hand_over(backend, [timed, untimed], now=1.0)         # the supervisor's clock, here a test's
    [(_, items, _)] = backend.sent
    assert [item[4] for item in items] == [0.25, None]
    # ...counted from when it was sent by the host's clock, the one the worker reads: not the supervisor's
    assert all(before <= item[6] <= time.monotonic() for item in items)


def test_results_before_the_last_hand_over_was_read_leave_the_worker_busy_and_its_requests_waiting():
    backend, worker = Backend(), handle()
    events = worker_events(SimpleNamespace(serving=lambda: [worker], workers=[worker], gone_stats={}))
    worker.hand_over(backend, entries(1, 2), now=1.0)
    worker.hand_over(backend, entries(3), now=1.5)
    # RESULTS for the first hand-over, sent before the worker had read the second: 2 got no answer
    events.on_results(worker, [[1, True, {"ok": 1}]], {}, [], 1)
    assert worker.state == BUSY and list(worker.inflight) == [3]
    assert [(e.tag, ok) for e, ok, _ in events.answered] == [(1, True), (2, False)]
    events.on_results(worker, [[3, True, {"ok": 3}]], {}, [], 2)
    assert worker.state == IDLE and not worker.inflight


SERVE_SETTLED = """
import gc, sys
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.warmup import warm_up
from jevany_daemon.model.loading import load_model
from jevany_daemon.worker.process import settle_heap

engine = Engine(load_model(sys.argv[1], device="cpu", dtype="fp32"), EngineConfig(max_batch_size=8))
warm_up(engine)
settle_heap()
frozen = gc.get_freeze_count()
for seed in range(12):                       # new texts each pass: the prompts' pieces are remembered
    engine.score(engine.admit_many(workloads.short(8, seed=seed)))
gc.collect()
gc.collect()
print(frozen, len(gc.get_objects()))
"""


def test_a_worker_keeps_what_it_loaded_out_of_full_collections_and_serving_adds_little(tiny_model):
    # In a process of its own: freezing is for the rest of a process's life.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SERVE_SETTLED, str(tiny_model("qwen3", "choice"))],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    frozen, tracked = map(int, out.split())
    assert frozen > 100_000                  # the model, the tokenizer, torch and transformers
    assert tracked < 200                     # what a full collection still walks after a dozen passes


def _events_with(state: str):
    """WorkerEvents whose pool, metrics and fail are stand-ins: what replace_or_fail reads and calls, recorded."""
    from types import SimpleNamespace

    from jevany_daemon.server.run_state import RunState

    done = {"failed": None, "replaced": 0}
    counter = SimpleNamespace(inc=lambda: None)
    run_state = RunState(0.0)
    if state == "ready":
        run_state.ready()
    pool = SimpleNamespace(replace=lambda w, s: done.update(replaced=done["replaced"] + 1)
                           or SimpleNamespace(restarts=1, pid=2))
    events = worker_events(pool, run_state=run_state,
                           fail=lambda message, exit_code=1: done.update(failed=(message, exit_code)),
                           metrics=SimpleNamespace(restarts=SimpleNamespace(labels=lambda cause: counter)))
    return events, done


@pytest.mark.parametrize("state,failed_starts,outcome", [
    ("starting", 0, ("failed", 2)),      # at start: a settings error, which systemd does not restart
    ("ready", 0, "replaced"),             # a replacement while others serve: tried again, as a crash is
    ("ready", 2, ("failed", 2)),          # ... up to MAX_FAILED_STARTS
])
def test_a_worker_whose_plan_would_warm_too_long_stops_a_start_and_is_retried_while_serving(
        state, failed_starts, outcome):
    events, done = _events_with(state)
    worker = handle(state=STARTING, ready=False, returncode=channel.EXIT_SETTINGS)      # never ready
    worker.failure, worker.failed_starts = "warming the shape plan's 234 buckets ... --warmup-limit", failed_starts
    events.replace_or_fail(worker, worker.exit_cause())
    if outcome == "replaced":
        assert done == {"failed": None, "replaced": 1}
    else:
        assert done["replaced"] == 0 and done["failed"] == (worker.failure, outcome[1])


def test_a_busy_worker_counts_as_up_in_the_status_line_and_the_serving_flag():
    # A worker scoring a batch serves: counting only idle ones would show a loaded daemon as down
    # (status "serving": false, "0/1 workers" in systemd's STATUS=) exactly when it works hardest.
    from jevany_daemon.server.request_queue import RequestQueue
    from jevany_daemon.server.status import Counters, status_line, workers_up

    busy, idle = handle(state=BUSY, busy_since=1.0), handle()
    loading, leaving = handle(state=STARTING, ready=False), handle(state=STOPPING, stop_sent_at=1.0)
    assert workers_up(SimpleNamespace(serving=lambda: [busy])) == 1          # status's "serving" is this > 0
    pool = SimpleNamespace(serving=lambda: [busy, idle, loading, leaving])
    line = status_line("ready", pool, RequestQueue(8), Counters(), 0.0)
    assert line.startswith("ready: 2/4 workers, queue 0/8,"), line


def test_the_thread_policy_rides_with_results_and_stays_out_of_the_statistics():
    worker = handle()
    assert worker.describe("serving")["threads"] is None
    threads = {"most": 2, "adaptive": True, "passes": {"1": 30, "2": 2}, "measured_tokens_per_s": {"1@64": 9e3}}
    worker.take_stats({"batches": 32, "requests": 70, "threads": threads})
    assert worker.stats == {"batches": 32, "requests": 70}
    worker.take_stats({"batches": 33, "requests": 71})                   # a message without it keeps the last
    assert worker.describe("serving")["threads"] == threads
