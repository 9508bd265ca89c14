"""The shape plan through a real daemon: warmed before ready, said in the log and status, and bounded at start."""
import subprocess
import sys
from pathlib import Path

from jevany_daemon import workloads
from jevany_daemon.parity import compare

from .client_proc import streamed
from .daemons import wait_for
from .test_promises_metrics import scrape

N_CLIENTS = 8
PER_CLIENT = 4
PLAN = ("--shape-plan", "--max-batch-size", "4", "--max-packed-tokens", "512", "--device", "cpu")


def test_a_planned_daemon_warms_its_plan_before_ready_and_counts_its_passes(start_daemon, loaded_model):
    daemon = start_daemon(*PLAN, "--metrics-port", "0", readout="choice")
    log = daemon.log.read_text()
    line = next(line for line in log.splitlines() if "event=shape_plan " in line)
    assert "runner=eager" in line and "buckets=" in line and "first_runs_s=" in line
    assert log.index("event=shape_plan ") < log.index("event=ready")
    bodies = workloads.short(N_CLIENTS * PER_CLIENT, seed=31)
    got = streamed(daemon.endpoint, bodies, N_CLIENTS)
    order = [(k * 100 + i, bodies[k + i * N_CLIENTS]) for k in range(N_CLIENTS) for i in range(PER_CLIENT)]
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine

    engine = Engine(loaded_model("qwen3", "choice"), EngineConfig())
    report = compare([engine.decide(body) for _, body in order], [got[index] for index, _ in order])
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == []
    status = daemon.status()
    plan = status["plan"]
    assert plan["runner"] == "eager" and plan["buckets"] > 20 and plan["cached"] > 0
    assert plan["planned"] == status["batching"]["batches"] and plan["eager"] == {}
    assert max(plan["rows"]) == 16 and max(plan["widths"]) == 512
    ctl = subprocess.run([str(Path(sys.executable).parent / "jevany-ctl"), "status", "--endpoint", daemon.endpoint],
                         capture_output=True, text=True, timeout=60)
    row = next(line for line in ctl.stdout.splitlines() if line.startswith("plan "))
    assert f"eager, {plan['buckets']} shapes" in row and f"{plan['planned']} passes planned, 0 as they came" in row
    with daemon.client() as client:
        described = client.models()["models"][0]
    assert described["plan"]["buckets"] == plan["buckets"] and described["acceleration"]["cuda_graphs"] is None
    # the gauges are set on the supervisor's tick: equal to status once it has come
    wait_for(lambda: scrape(daemon).get(("jevany_plan_passes", (("path", "planned"),))) == plan["planned"], 30,
             "jevany_plan_passes{path=planned} equal to status's planned passes")
    assert daemon.stop() == 0


def test_without_a_plan_status_says_so(start_daemon):
    daemon = start_daemon("--device", "cpu")
    assert daemon.status()["plan"] == {"runner": None, "buckets": None, "rows": None, "widths": None,
                                       "max_tokens": None, "cached": None, "warm_up_s": None, "captured": None,
                                       "planned": 0, "eager": {}, "recompiles": 0}
    assert daemon.stop() == 0


def test_a_plan_that_would_warm_past_its_limit_stops_the_start_with_a_settings_error(start_daemon):
    daemon = start_daemon(*PLAN, "--warmup-limit", "0.01", ready=False)
    assert daemon.proc.wait(120) == 2
    log = daemon.log.read_text()
    failed = next(line for line in log.splitlines() if "event=startup_failed" in line)
    assert "over the warm-up limit of 0.01 s" in failed and "raise --warmup-limit" in failed
    assert "event=ready" not in log
