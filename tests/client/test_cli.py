import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jevany_client import JevClient, WorkerLostError, fleet
from jevany_client.cli import client_app, ctl_app, format_status

from .conftest import fake_daemon

BODY = {"state": {"turn": 1}, "questions": {"q": {"type": "noul"}}}
BIN = Path(sys.executable).parent


@pytest.fixture
def runner():
    return CliRunner()


def test_status_prints_a_readable_table(runner, daemon):
    result = runner.invoke(ctl_app, ["status", "--endpoint", daemon.endpoint])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "state ready" in out and f"pid {daemon.process.pid}" in out
    assert "fake-tiny" in out and "/models/fake-tiny" in out
    assert "layout rows" in out and "dtype fp32" in out
    assert daemon.endpoint in out
    assert "3 / 1024" in out
    assert "7 for 12 requests, mean size 1.71" in out
    assert "p50 1.2 ms" in out and "p99 9.5 ms" in out
    worker = next(line for line in out.splitlines() if str(daemon.process.pid + 1) in line)
    assert worker.split() == [str(daemon.process.pid + 1), "idle", "1", "12", "0.5/16.0", "GiB", "cpu", "Fake", "CPU"]
    histogram = out.split("batch sizes")[1].splitlines()[1:]
    assert [line.split()[0] for line in histogram] == ["1", "2", "10"]  # numeric order
    assert [line.split()[-1] for line in histogram] == ["4", "1", "2"]


def test_status_counts_errors_by_code(runner, daemon):
    with JevClient(daemon.endpoint, timeout=5.0) as client, pytest.raises(WorkerLostError):
        client.decide("error:worker_lost", {"q": {"type": "noul"}})
    out = runner.invoke(ctl_app, ["status", "-e", daemon.endpoint]).stdout
    errors = out.split("errors by code")[1].split("\n\n")[0]
    assert "worker_lost" in errors


def test_status_json_is_the_raw_result(runner, daemon):
    result = runner.invoke(ctl_app, ["status", "--endpoint", daemon.endpoint, "--json"])
    assert result.exit_code == 0
    status = json.loads(result.stdout)
    assert status["pid"] == daemon.process.pid
    assert status["batching"]["batch_size_histogram"] == {"1": 4, "2": 1, "10": 2}


def test_format_status_tolerates_missing_fields():
    text = format_status({"state": "starting"})
    assert "state starting" in text
    assert "model      -" in text and "plan       -" in text and "workers: none" in text


def test_format_status_says_how_passes_run():
    off = format_status({"state": "ready", "plan": {"runner": None, "planned": 0, "eager": {}}})
    assert "plan       off: passes run in the shapes they come in (--shape-plan, --cuda-graphs)" in off
    graphs = format_status({"state": "ready", "plan": {"runner": "graphs", "buckets": 234, "captured": 200,
                                                        "planned": 90, "eager": {"shape": 2, "layout": 1},
                                                        "recompiles": 0}})
    assert "plan       graphs, 234 shapes (200 captured)   90 passes planned, 3 as they came (1 layout, 2 shape)" \
        in graphs
    compiled = format_status({"state": "ready", "plan": {"runner": "compiled", "buckets": 9, "planned": 4,
                                                          "eager": {}, "recompiles": 1}})
    assert "compiled, 9 shapes   4 passes planned, 0 as they came, 1 recompiles" in compiled


def test_format_status_tells_decide_requests_apart_and_says_when_weights_are_random():
    text = format_status({"state": "ready", "requests": {"ok": 66, "error": 0, "by_op": {"decide": 48, "status": 18}},
                          "model": {"id": "tiny-demo", "source": "/c/tiny", "random_weights": True}})
    assert "requests   48 decide   66 ok   0 error" in text
    assert "/c/tiny   (RANDOM weights: the built-in demo model" in text
    assert "RANDOM" not in format_status({"state": "ready", "model": {"id": "m", "random_weights": False}})


def test_format_status_shows_each_workers_device_and_memory():
    gib = 1 << 30
    workers = [
        {"pid": 11, "device": "cuda:1", "state": "idle", "restarts": 0, "requests": 5,
         "device_info": {"name": "NVIDIA H200", "memory_used_bytes": int(12.3 * gib),
                         "memory_total_bytes": int(139.8 * gib)}},
        {"pid": 12, "device": "cpu", "state": "busy", "restarts": 1, "requests": 2},          # an older worker
        {"pid": 13, "device": "cuda:0", "state": "idle", "device_info": {"name": None, "memory_used_bytes": "x",
                                                                       "memory_total_bytes": 8 * gib}},
        {"pid": 14, "device_info": "not a dict"},
    ]
    block = format_status({"state": "ready", "workers": workers}).split("workers (4)\n")[1].splitlines()
    assert block[0].split() == ["PID", "STATE", "RESTARTS", "REQUESTS", "MEMORY", "DEVICE"]
    assert block[1].split() == ["11", "idle", "0", "5", "12.3/139.8", "GiB", "cuda:1", "NVIDIA", "H200"]
    assert block[2].split() == ["12", "busy", "1", "2", "-", "cpu"]
    assert block[3].split() == ["13", "idle", "-", "-", "-/8.0", "GiB", "cuda:0"]
    assert block[4].split() == ["14", "-", "-", "-", "-", "-"]


def test_ping_and_models(runner, daemon):
    ping = runner.invoke(ctl_app, ["ping", "-e", daemon.endpoint])
    assert ping.exit_code == 0 and "version test" in ping.stdout
    models = runner.invoke(ctl_app, ["models", "-e", daemon.endpoint])
    assert models.stdout.splitlines()[0] == "fake-tiny"
    assert "jevany-latest" in models.stdout
    raw = runner.invoke(ctl_app, ["models", "-e", daemon.endpoint, "--json"])
    assert json.loads(raw.stdout)["models"][0]["layout"] == "rows"


@pytest.mark.parametrize("command", ["clear-cache", "drain", "reload"])
def test_control_ops_default_to_the_control_endpoint(runner, daemon, monkeypatch, command):
    monkeypatch.setenv("JEVANY_CONTROL_ENDPOINT", daemon.control)
    result = runner.invoke(ctl_app, [command])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["op"] == command.replace("-", "_")


def test_control_op_on_the_public_endpoint_exits_1(runner, daemon):
    result = runner.invoke(ctl_app, ["drain", "--control", daemon.endpoint])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: forbidden: ")


def test_ctl_against_nothing_fails_fast_with_a_clear_message(runner, stale):
    started = time.monotonic()
    result = runner.invoke(ctl_app, ["status", "--endpoint", stale, "--timeout", "0.3"])
    assert time.monotonic() - started < 3
    assert result.exit_code == 2
    assert result.stderr.strip() == f"daemon not reachable at {stale} within 0.3s"


def test_ctl_where_no_socket_file_is_says_so_at_once(runner, nowhere):
    started = time.monotonic()
    result = runner.invoke(ctl_app, ["status", "--endpoint", nowhere, "--timeout", "30"])
    assert time.monotonic() - started < 1
    assert result.exit_code == 2
    assert result.stderr.startswith(f"no daemon at {nowhere[len('ipc://'):]}: no socket file there (is the "
                                    "daemon running")


def test_installed_jevany_ctl_against_nothing_uses_the_short_default_timeout(stale):
    started = time.monotonic()
    result = subprocess.run(
        [BIN / "jevany-ctl", "ping", "--endpoint", stale],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert 3 <= time.monotonic() - started < 10
    assert result.returncode == 2
    assert f"daemon not reachable at {stale} within 3s" in result.stderr


def test_client_decide_file(runner, daemon, tmp_path):
    path = tmp_path / "body.json"
    path.write_text(json.dumps(BODY))
    result = runner.invoke(client_app, ["decide", str(path), "--endpoint", daemon.endpoint])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == {"turn": 1}


def test_client_decide_stdin(runner, daemon):
    args = ["decide", "-", "-e", daemon.endpoint]
    result = runner.invoke(client_app, args, input=json.dumps(BODY))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == {"turn": 1}


def test_client_decide_error_exits_1(runner, daemon):
    body = json.dumps({**BODY, "state": "error:context_length_exceeded"})
    result = runner.invoke(client_app, ["decide", "-", "-e", daemon.endpoint], input=body)
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: context_length_exceeded: fake context_length_exceeded"


def test_client_decide_unreachable_exits_2(runner, nowhere):
    result = runner.invoke(
        client_app, ["decide", "-", "-e", nowhere, "--timeout", "0.2"], input=json.dumps(BODY)
    )
    assert result.exit_code == 2
    assert "no daemon at" in result.stderr


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_client_decide_bad_file_exits_2(runner, nowhere, text):
    result = runner.invoke(client_app, ["decide", "-", "-e", nowhere], input=text)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")


def test_entry_points_are_installed_with_help():
    ctl_commands = ["status", "ping", "models", "clear-cache", "drain", "reload"]
    for script, commands in (("jevany-client", ["decide"]), ("jevany-ctl", ctl_commands)):
        result = subprocess.run([BIN / script], capture_output=True, text=True, timeout=30)
        # no_args_is_help: the help on stderr, exit 2, as jevany-daemon's (click's plain layout)
        assert result.returncode == 2 and "Usage" in result.stderr, script
        assert all(command in result.stderr for command in commands), script


def test_format_status_shows_the_http_gateway_and_counts_transports_apart():
    text = format_status({"state": "ready",
                          "requests": {"ok": 10, "error": 0, "by_op": {"decide": 10},
                                       "decide_by_transport": {"zmq": 4, "http": 6}},
                          "batching": {"mixed_transport_batches": 3},
                          "http": {"address": "http://127.0.0.1:8008", "pid": 42, "state": "up", "restarts": 1}})
    assert "10 decide (4 zmq, 6 http)" in text
    assert "http       http://127.0.0.1:8008   gateway up, pid 42, 1 restarts   3 batches mixed http and zmq" in text
    assert "gateway" not in format_status({"state": "ready", "http": None})


def test_client_decide_adds_media_by_suffix_or_prefix(runner, daemon, tmp_path):
    path = tmp_path / "body.json"
    path.write_text(json.dumps({**BODY, "media": [{"type": "image", "uri": "first.png"}]}))
    args = ["decide", str(path), "-e", daemon.endpoint, "--media", "cat.JPG", "--media", "clips/walk.mp4",
            "--media", "video:raw.bin"]
    result = runner.invoke(client_app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["media"] == [
        {"type": "image", "uri": "first.png"}, {"type": "image", "uri": "cat.JPG"},
        {"type": "video", "uri": "clips/walk.mp4"}, {"type": "video", "uri": "raw.bin"}]
    result = runner.invoke(client_app, ["decide", str(path), "-e", daemon.endpoint, "--media", "notes.txt"])
    assert result.exit_code == 2
    assert "--media: cannot tell whether 'notes.txt' is an image or a video; write image:notes.txt" in result.stderr


def test_status_ready_exits_0_only_when_ready(runner, daemon, socket_dir, stale):
    ready = runner.invoke(ctl_app, ["status", "--ready", "--endpoint", daemon.endpoint])
    assert (ready.exit_code, ready.output) == (0, f"{daemon.endpoint}: ready\n")
    with fake_daemon(socket_dir, "loading", state="starting") as loading:
        starting = runner.invoke(ctl_app, ["status", "--ready", "--endpoint", loading.endpoint])
    assert (starting.exit_code, starting.output) == (1, f"{loading.endpoint}: starting\n")
    gone = runner.invoke(ctl_app, ["status", "--ready", "--endpoint", stale, "--timeout", "0.2"])
    assert gone.exit_code == 2


def test_client_decide_routes_as_asked_and_refuses_an_unknown_routing(runner, daemon, beta, tmp_path, monkeypatch):
    # Each call is a fresh client: one whose connection to the key's daemon is not greeted (handshake done)
    # within the grace sends elsewhere (as it should), and a starved CI core can take that long.
    monkeypatch.setattr(fleet, "CONNECT_GRACE_S", 30.0)
    body = tmp_path / "request.json"
    body.write_text(json.dumps({"state": "x" * 2000, "questions": {"urgent": {"type": "noul"}}}))
    args = ["decide", str(body), "-e", daemon.endpoint, "-e", beta.endpoint, "--routing"]
    servers = {json.loads(runner.invoke(client_app, [*args, "affinity"]).output)["server"] for _ in range(6)}
    assert len(servers) == 1                        # one state, one daemon, call after call
    refused = runner.invoke(client_app, [*args, "fastest"])
    assert refused.exit_code == 2 and "routing must be one of" in refused.output


def test_format_status_says_when_batching_is_off_and_the_flag_that_turns_it_on():
    off = format_status({"state": "ready", "batching": {"max_batch_size": 1}})
    assert "batching   OFF: each request runs alone (serve with --max-batch-size 32 to share passes)" in off
    on = format_status({"state": "ready", "batching": {"max_batch_size": 32}})
    assert "batching   up to 32 requests a pass" in on and "OFF" not in on


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("typed, advice", [
    ("localhost:5555", "did you mean tcp://localhost:5555?"),
    ("/run/x.sock", "did you mean ipc:///run/x.sock?"),
    ("http://127.0.0.1:8008", "that is an HTTP URL: the daemon's HTTP gateway speaks HTTP (curl/POST "
                              "/v1/systemone); ZeroMQ clients use tcp://HOST:PORT of --bind"),
    ("tcp://localhost", "write tcp://HOST:PORT"),
])
def test_an_endpoint_no_client_can_use_is_refused_at_once_with_the_form_meant(runner, typed, advice):
    started = time.monotonic()
    for app, args in ((ctl_app, ["ping", "-e", typed]), (client_app, ["decide", "-", "-e", typed])):
        result = runner.invoke(app, args, input=json.dumps(BODY))
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"error: cannot use the endpoint {typed!r}: endpoints are ipc://PATH or "
                                        "tcp://HOST:PORT"), result.stderr
        assert advice in result.stderr
    assert time.monotonic() - started < 2


def test_a_tcp_endpoint_nobody_listens_at_fails_in_seconds_not_the_timeout(runner):
    port = _free_port()
    started = time.monotonic()
    result = runner.invoke(client_app, ["decide", "-", "-e", f"tcp://127.0.0.1:{port}"], input=json.dumps(BODY))
    assert time.monotonic() - started < 5       # not the 30 s default timeout
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: tcp://127.0.0.1:{port}: nothing listens at 127.0.0.1:{port}: "
                                     f"is the daemon running, and is {port} its --bind?")


def test_a_tcp_port_that_listens_without_speaking_zeromq_looks_like_http(runner):
    import socket

    with socket.socket() as quiet:      # accepts connections (the kernel's backlog) and says nothing, as HTTP does
        quiet.bind(("127.0.0.1", 0))
        quiet.listen(4)
        port = quiet.getsockname()[1]
        started = time.monotonic()
        result = runner.invoke(ctl_app, ["status", "-e", f"tcp://127.0.0.1:{port}", "--timeout", "30"])
        assert time.monotonic() - started < 6
    assert result.exit_code == 2
    assert f"something listens at 127.0.0.1:{port} but sent no ZeroMQ greeting" in result.stderr
    assert "it looks like an HTTP port; the daemon's HTTP gateway speaks HTTP" in result.stderr


def test_a_daemon_on_tcp_passes_the_probe(runner, socket_dir):
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    with fake_daemon(socket_dir, "tcp-one", endpoint=endpoint):
        result = runner.invoke(ctl_app, ["ping", "-e", endpoint])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"pong from {endpoint}")


@pytest.mark.parametrize("command, waiting", [("reload", "reloading: waiting for the new workers to load ("),
                                              ("drain", "draining: waiting for the requests in flight to be "
                                                        "answered (")])
def test_reload_and_drain_say_what_they_wait_for_while_they_wait(runner, socket_dir, monkeypatch, command, waiting):
    import jevany_client.cli as cli

    monkeypatch.setenv("FAKE_SETTLE_S", "1.2")      # the fake daemon replies to drain and reload after that
    monkeypatch.setattr(cli, "PROGRESS_EVERY_S", 0.3)
    with fake_daemon(socket_dir, f"slow-{command}", control=True) as slow:
        result = runner.invoke(ctl_app, [command, "--control", slow.control])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["op"] == command
    said = result.stderr.splitlines()
    assert len(said) >= 2 and all(line.startswith(waiting) and line.endswith(" s)") for line in said), said


def test_format_status_shows_the_metrics_url_the_readout_while_loading_and_waits_left_out():
    text = format_status({"state": "starting", "metrics": "http://127.0.0.1:40123/metrics", "model": {"readout": ""},
                          "latency_ms": {"p50": 12.0, "p99": 30.0, "samples": 4, "waited_for_load": 3}})
    assert "metrics    http://127.0.0.1:40123/metrics" in text
    assert "readout    (known once the model has loaded)" in text
    assert "p99 30.0 ms   (3 that waited for the model to load left out)" in text
    assert "metrics    off" in format_status({"state": "ready", "metrics": None})


def test_status_watch_shows_the_page_again_until_ctrl_c(runner, daemon, monkeypatch):
    naps = []

    def nap(seconds):
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", nap)
    result = runner.invoke(ctl_app, ["status", "--endpoint", daemon.endpoint, "--watch", "2"])
    assert result.exit_code == 0 and naps == [2.0, 2.0, 2.0]
    assert result.stdout.count("state ready") == 3          # not a terminal: one page after another


def test_status_ready_is_not_ready_while_no_worker_is_up(runner, monkeypatch):
    """As /health's 503: a daemon whose every worker is being replaced can take no request now."""
    import jevany_client.cli as cli

    for serving, code, said in ((True, 0, ": ready"), (False, 1, ": ready, but no worker is up")):
        monkeypatch.setattr(cli, "_ask", lambda *a, serving=serving, **k: {"state": "ready", "serving": serving})
        result = runner.invoke(ctl_app, ["status", "--ready", "-e", "ipc:///nowhere.sock"])
        assert result.exit_code == code and said in result.stdout


def test_the_probe_fails_only_when_no_tcp_endpoint_can_answer(socket_dir, capsys):
    import typer

    from jevany_client import cli

    alive, dead = f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}"
    with fake_daemon(socket_dir, "tcp-probe", endpoint=alive):
        cli._probe([dead, alive], 2.0)          # one endpoint that may answer is enough to send
    with pytest.raises(typer.Exit) as caught:
        cli._probe([dead], 2.0)
    assert caught.value.exit_code == 2 and f"error: {dead}: nothing listens at" in capsys.readouterr().err
