"""CUDA faults in a real worker process: a poisoned device ends its worker, out-of-memory does not.

A CPU raises neither error, so the worker raises them on cue from
faults/sitecustomize.py, where CUDA would: inside attention.
"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from jevany_client import WorkerLostError
from jevany_daemon import workloads
from jevany_daemon.parity import compare

from .daemons import wait_for
from .shared_daemons import fault_env

BODY = workloads.short(1, seed=9)[0]


@pytest.fixture
def faulty_daemon(start_daemon, tmp_path):
    def start(*args):
        daemon = start_daemon(*args, env=fault_env(tmp_path))
        return daemon, tmp_path
    return start


def _one(client) -> dict:
    return client.decide_many([BODY])[0]


def _worker(daemon) -> dict:
    return next(w for w in daemon.workers() if w["role"] == "serving")


def test_a_poisoned_device_ends_its_worker_and_a_fresh_one_serves(faulty_daemon):
    daemon, triggers = faulty_daemon()
    with daemon.client(timeout=60, retries=0) as client:
        before = _one(client)
        first = _worker(daemon)
        (triggers / "poison").write_text("")
        with pytest.raises(WorkerLostError):
            _one(client)
        assert not (triggers / "poison").exists()          # the fault fired
        fresh = wait_for(lambda: (w := _worker(daemon))["pid"] != first["pid"] and w["state"] == "idle" and w,
                         60, "a fresh worker")
        after = _one(client)
    assert fresh["restarts"] == 1
    assert after["answers"] == before["answers"]
    log = daemon.log.read_text()
    assert "event=worker_device_lost" in log and "illegal memory access" in log
    assert "device error: its CUDA context cannot be used again" in log


def test_out_of_memory_rescores_alone_and_the_worker_keeps_serving(faulty_daemon):
    # no prefix cache: it would run twelve requests on one state as a single row
    daemon, triggers = faulty_daemon("--max-batch-size", "16", "--batch-policy", "greedy", "--prefix-cache", "0")
    bodies = [BODY] * 12                  # one width, so whatever queues behind the first forms one batch
    with daemon.client(timeout=60, retries=0) as client:
        expected = _one(client)
        pid = _worker(daemon)["pid"]
        (triggers / "oom").write_text("2")                 # fires on the first pass of two or more
        results = client.decide_many(bodies, return_exceptions=True)
    assert not (triggers / "oom").exists()                 # a batched pass hit it
    assert all(isinstance(r, dict) for r in results), results
    # rows that went on batched after the fault may differ from the lone pass in the last bits (the CPU's
    # matmul blocks by batch size), so the same tolerance as the parity tests, not equality
    report = compare([expected] * len(results), results)
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == [], report
    worker = _worker(daemon)
    assert worker["pid"] == pid and worker["restarts"] == 0
    assert "worker_device_lost" not in daemon.log.read_text()


def test_a_model_that_cannot_score_here_stops_the_daemon_at_load(tiny_model, tmp_path):
    """Warm-up scores before ready: a model whose passes come out NaN never takes a request."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "nan-model"
    shutil.copytree(tiny_model("qwen3", "choice"), broken)
    weights = load_file(broken / "model.safetensors")
    weights["model.norm.weight"] = torch.full_like(weights["model.norm.weight"], float("nan"))
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    d = Path(tempfile.mkdtemp(prefix="jvd-"))
    proc = subprocess.run([sys.executable, "-m", "jevany_daemon", "serve", "--model", str(broken),
                           "--bind", f"ipc://{d}/s.sock", "--control", f"ipc://{d}/c.sock"],
                          capture_output=True, text=True, timeout=120)
    shutil.rmtree(d, ignore_errors=True)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "warm-up scoring failed" in proc.stderr and "non-finite" in proc.stderr
    assert "event=startup_failed" in proc.stderr and "worker_restart" not in proc.stderr
