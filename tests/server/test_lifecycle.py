"""Start-up, shutdown and client timeouts against a real daemon process."""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from jevany_client import DeadlineExceededError, JevTimeoutError
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.parity import answer_problems, compare

from .daemons import wait_for

GOOD = workloads.short(1, seed=4)[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_under_load_answers_everything_and_exits_clean(start_daemon, sig):
    # The worker is stopped (SIGSTOP) while the signal arrives, so the drain cannot finish before
    # the test has seen what it promises: everything accepted still queued, new work refused.
    daemon = start_daemon("--max-batch-size", "4", "--heartbeat-timeout", "300")
    worker = daemon.workers()[0]["pid"]
    bodies = workloads.short(24, seed=8)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)
    sock.connect(daemon.endpoint)
    os.kill(worker, signal.SIGSTOP)
    try:
        for i, body in enumerate(bodies):
            sock.send(msgpack.packb({"v": 1, "id": i, "op": "decide", "body": body}))
        wait_for(lambda: _held(daemon) == len(bodies), 60, "every request accepted")
        daemon.proc.send_signal(sig)
        wait_for(lambda: f"event=drain cause={signal.Signals(sig).name}" in daemon.log.read_text(), 60,
                 "the drain begins")
        sock.send(msgpack.packb({"v": 1, "id": "late", "op": "decide", "body": GOOD}))
        late = msgpack.unpackb(sock.recv())
    finally:
        os.kill(worker, signal.SIGCONT)
    replies = {r["id"]: r for r in (msgpack.unpackb(sock.recv()) for _ in bodies)}
    ctx.destroy(linger=0)
    assert late["id"] == "late" and late["error"]["code"] == "shutting_down"
    assert sorted(replies) == list(range(len(bodies)))
    assert all(r["ok"] for r in replies.values()), [r["error"] for r in replies.values() if not r["ok"]]
    assert [p for i, body in enumerate(bodies) for p in answer_problems(body, replies[i]["result"])] == []
    assert daemon.proc.wait(60) == 0
    assert not daemon.socket.exists()
    assert "event=stop exit_code=0" in daemon.log.read_text()


def _held(daemon) -> int:
    """Requests the daemon holds: queued, or handed to a worker and not yet answered."""
    status = daemon.status()
    return status["queue"]["depth"] + sum(w["inflight"] for w in status["workers"])


def test_client_timeout_then_success_on_the_same_client(start_daemon, loaded_model):
    daemon = start_daemon()
    late, after = workloads.mixed(64, seed=14, max_words=12), workloads.mixed(3, seed=15, max_words=12)
    with daemon.client(timeout=60) as client:
        assert client.ping()["pong"] is True       # connected, so the 64 below really leave
        # 64 distinct requests pipelined, 1 ms to wait: the replies come later and must be discarded.
        # On a loaded machine the daemon's own refusals (deadline_exceeded: the 1 ms passed on its side
        # too) can all be in before the client's 1 ms is seen to run out; then there is nothing late, so
        # the round is sent again.
        for _ in range(5):
            try:
                client.decide_many(late, timeout=0.001)
            except JevTimeoutError:
                break
            except DeadlineExceededError:
                continue
        else:
            pytest.fail("every round's replies were in before the client's 1 ms ran out")
        got = [client.call("decide", body) for body in after]
        assert client.discarded > 0                # late replies did arrive while these calls waited
    daemon.stop()
    # each call got the answer to its own body, not a late reply to one of the 64
    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig())
    report = compare([engine.decide(body) for body in after], got)
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == [] and not report["mismatched"]


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


def test_a_start_cut_short_closes_the_endpoints_it_had_bound(tiny_model):
    # The first of two --bind endpoints was bound when the second failed: left open, it held the ZeroMQ
    # context's termination for ever, and the daemon never exited.
    d = Path(tempfile.mkdtemp(prefix="jvd-"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_serve("--model", str(tiny_model("qwen3", "pointer")), "--bind", f"ipc://{d}/first.sock",
                         "--bind", f"tcp://127.0.0.1:{port}", "--control", f"ipc://{d}/c.sock", timeout=30)
    assert proc.returncode == 1 and f"cannot bind tcp://127.0.0.1:{port} (--bind)" in proc.stderr
    assert "event=stop exit_code=1" in proc.stderr
    assert not (d / "first.sock").exists()          # the one it had bound is closed, its file removed
    os.rmdir(d)


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
    threads = status["workers"][0]["threads"]      # one thread given: nothing to choose between
    assert (threads["most"], threads["adaptive"], threads["passes"]) == (1, False, {"1": 1})
    assert status["latency_ms"]["p50"] > 0
    assert 0 < status["batching"]["busy_s"] <= status["uptime_s"]
    [described] = models["models"]
    assert described["aliases"] == ["jevany-latest"] and described["layout"] == "packed"
    assert described["limits"]["max_batch_size"] == 4 and described["cpu_threads"] == 1
    daemon.stop()


@pytest.mark.parametrize("bound,asked", [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "*")])
def test_a_taken_tcp_port_says_which_flag_and_what_to_do(bound, asked):
    from jevany_daemon.server.sockets import StartupError, bind_router

    ctx = zmq.Context()
    try:
        with socket.socket() as taken:
            taken.bind((bound, 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(StartupError) as info:
                bind_router(ctx, f"tcp://{asked}:{port}", 1 << 20, flag="--control")
    finally:
        ctx.term()
    said = str(info.value)
    assert said.startswith(f"cannot bind tcp://{asked}:{port} (--control): Address already in use; ")
    assert "choose another port for --control, or stop what holds it" in said
    assert f"`jevany-ctl status --endpoint tcp://127.0.0.1:{port}`" in said     # a wildcard is not dialled
    assert f"`ss -ltnp 'sport = :{port}'`" in said


def test_a_taken_metrics_port_names_the_flag_and_the_way_out():
    from types import SimpleNamespace

    from jevany_daemon.server.lifecycle import _serve_metrics
    from jevany_daemon.server.metrics import Metrics
    from jevany_daemon.server.sockets import StartupError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartupError) as info:
            _serve_metrics(SimpleNamespace(metrics_port=port, metrics_host="127.0.0.1"), Metrics())
    assert str(info.value) == (f"cannot serve metrics on 127.0.0.1:{port} (--metrics-port): Address already in use; "
                               "choose another --metrics-port, or --metrics-port 0 for a free one (status and the "
                               "start-up log show which)")


# --- parts of the start without a daemon ------------------------------------------------------------------

def test_client_messages_come_in_on_the_public_sockets_the_control_socket_and_the_gateways():
    from types import SimpleNamespace

    from jevany_daemon.server.lifecycle import Wiring

    gateway = SimpleNamespace(sock="gateway")
    assert Wiring(public=("a", "b"), control="control", gateway=gateway).client_sockets() == [
        "a", "b", "control", "gateway"]
    assert Wiring(public=("a",)).client_sockets() == ["a"]


def test_the_metrics_url_puts_an_ipv6_host_in_brackets():
    from types import SimpleNamespace

    from jevany_daemon.server.lifecycle import _serve_metrics
    from jevany_daemon.server.metrics import Metrics

    metrics = Metrics()
    try:
        url = _serve_metrics(SimpleNamespace(metrics_port=0, metrics_host="::1"), metrics)
        assert url.startswith("http://[::1]:") and url.endswith("/metrics")
    finally:
        metrics.close()
    assert _serve_metrics(SimpleNamespace(metrics_port=None, metrics_host="127.0.0.1"), metrics) is None
