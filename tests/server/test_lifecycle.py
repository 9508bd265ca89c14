"""Start-up, shutdown and client timeouts against a real daemon process."""
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from jevany_client import JevTimeoutError
from jevany_daemon import workloads

GOOD = workloads.short(1, seed=4)[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_under_load_answers_everything_and_exits_clean(start_daemon, sig):
    daemon = start_daemon("--max-batch-size", "4")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)
    sock.connect(daemon.endpoint)
    n = 24
    for i, body in enumerate(workloads.short(n, seed=8)):
        sock.send(msgpack.packb({"v": 1, "id": i, "op": "decide", "body": body}))
    replies = [msgpack.unpackb(sock.recv())]     # scoring has begun
    daemon.proc.send_signal(sig)
    while len(replies) < n:
        replies.append(msgpack.unpackb(sock.recv()))
    ctx.destroy(linger=0)
    assert sorted(r["id"] for r in replies) == list(range(n))
    outcomes = {"ok" if r["ok"] else r["error"]["code"] for r in replies}
    assert outcomes <= {"ok", "shutting_down"}
    assert sum(r["ok"] for r in replies) >= 1
    assert daemon.proc.wait(60) == 0
    assert not daemon.socket.exists()
    log = daemon.log.read_text()
    assert f"event=drain cause={signal.Signals(sig).name}" in log and "event=stop exit_code=0" in log


def test_client_timeout_then_success_on_the_same_client(start_daemon):
    daemon = start_daemon()
    with daemon.client(timeout=60) as client:
        with pytest.raises(JevTimeoutError):
            # 200 requests pipelined, 1 ms to wait: the replies come later and must be discarded
            client.decide_many([GOOD] * 200, timeout=0.001)
        result = client.call("decide", GOOD)
        assert set(result["answers"]) == set(GOOD["questions"])
        assert client.ping()["pong"] is True
    daemon.stop()


def run_serve(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "jevany_daemon", "serve", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_invalid_settings_fail_before_any_weights_load(tmp_path):
    started = time.monotonic()
    for args, needle in [
        (["--max-batch-size", "0"], "max_batch_size must be an integer >= 1"),
        (["--dtype", "fp8"], "dtype must be one of"),
        (["--device", "gpu"], "device must be cpu, cuda or cuda:N"),
        (["--bind", "http://x"], "must be ipc://PATH or tcp://HOST:PORT"),
        (["--layout", "diagonal"], "layout must be one of"),
    ]:
        proc = run_serve("--model", str(tmp_path), *args)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr
    env_bad = subprocess.run([sys.executable, "-m", "jevany_daemon", "serve"], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "JEVANY_MAX_QUEUE": "lots"})
    assert env_bad.returncode == 2 and "JEVANY_MAX_QUEUE" in env_bad.stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_model_that_cannot_load_stops_the_daemon_with_its_reason(tmp_path, workers):
    d = Path(tempfile.mkdtemp(prefix="jvd-"))
    (tmp_path / "empty").mkdir()       # a directory with no model in it: only a worker finds out
    proc = run_serve("--model", str(tmp_path / "empty"), "--bind", f"ipc://{d}/s.sock",
                     "--control", f"ipc://{d}/c.sock", "--workers", workers, timeout=120)
    assert proc.returncode == 1
    assert "cannot load" in proc.stderr
    assert "event=startup_failed" in proc.stderr and "event=stop exit_code=1" in proc.stderr
    assert "worker_restart" not in proc.stderr
    assert not (d / "s.sock").exists()


def test_a_model_path_that_is_not_there_exits_2_before_any_worker(tmp_path):
    d = Path(tempfile.mkdtemp(prefix="jvd-"))
    started = time.monotonic()
    proc = run_serve("--model", str(tmp_path / "missing"), "--bind", f"ipc://{d}/s.sock", timeout=60)
    assert proc.returncode == 2 and time.monotonic() - started < 30
    assert proc.stderr.strip().endswith(f"error: --model: model does not exist: {tmp_path / 'missing'}")
    assert "worker" not in proc.stderr


def test_refuses_a_socket_another_daemon_is_serving(start_daemon, tiny_model):
    daemon = start_daemon()
    proc = run_serve("--model", str(tiny_model("qwen3", "pointer")), "--bind", daemon.endpoint,
                     "--control", f"ipc://{daemon.dir}/other-control.sock")
    assert proc.returncode == 1 and "another process is serving" in proc.stderr
    assert "choose another --bind" in proc.stderr
    assert "event=stop exit_code=1" in proc.stderr        # the log says what the exit status says
    # only the control socket clashes: the hint names --control
    proc = run_serve("--model", str(tiny_model("qwen3", "pointer")), "--bind", f"ipc://{daemon.dir}/other.sock",
                     "--control", daemon.control)
    assert proc.returncode == 1 and f"another process is serving on {daemon.control}; stop it or choose " \
        "another --control" in proc.stderr
    with daemon.client(timeout=30) as client:
        assert client.ping()["pong"]        # the first daemon kept its socket
    daemon.stop()


def test_status_fields(start_daemon):
    daemon = start_daemon("--max-batch-size", "4", "--max-queue", "77", "--cpu-threads", "1")
    with daemon.client(timeout=60) as client:
        client.call("decide", GOOD)
        status = client.status()
        models = client.models()
    for key in ("version", "pid", "uptime_s", "state", "endpoints", "max_message_bytes", "model",
                "batching", "queue", "workers", "requests", "latency_ms"):
        assert key in status
    assert status["state"] == "ready" and status["pid"] == daemon.proc.pid
    assert status["queue"] == {"depth": 0, "max_depth": 77}
    assert status["model"]["readout"] == "pointer" and status["model"]["dtype"] == "fp32"
    assert status["model"]["random_weights"] is False        # a model given by --model, not the demo
    assert status["batching"]["max_batch_size"] == 4 and status["batching"]["batch_size_histogram"] == {"1": 1}
    assert status["workers"][0]["requests"] == 1 and status["workers"][0]["state"] == "idle"
    assert status["latency_ms"]["p50"] > 0
    assert 0 < status["batching"]["busy_s"] <= status["uptime_s"]
    [described] = models["models"]
    assert described["aliases"] == ["jevany-latest"] and described["layout"] == "packed"
    assert described["limits"]["max_batch_size"] == 4 and described["cpu_threads"] == 1
    daemon.stop()
