"""Lifecycle promises on real daemons: the default runtime directory, a second signal, a worker counted
as hung, and replacements that die before loading.

Workers are frozen with SIGSTOP, or made to exit before loading by faults/sitecustomize.py
("exit_before_load"); each module daemon's last test ends it.
"""
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jevany_client import JevClient
from jevany_daemon import workloads

from .daemons import READY_WITHIN_S, STOP_WITHIN_S, wait_for
from .shared_daemons import Raw, fault_env, frozen, running_daemon, serving_worker

BODIES = workloads.short(5, seed=41)


# --- a daemon on its default endpoints --------------------------------------------------------

class DefaultDaemon:
    """`serve` with no --bind or --control: it makes its sockets in $XDG_RUNTIME_DIR/jevany."""

    def __init__(self, model: Path):
        self.runtime = Path(tempfile.mkdtemp(prefix="jvr-"))
        self.sockets = self.runtime / "jevany"
        self.endpoint = f"ipc://{self.sockets}/daemon.sock"
        self.log = self.runtime / "daemon.log"
        drop = {"JEVANY_ENDPOINT", "JEVANY_CONTROL_ENDPOINT", "JEVANY_BIND", "JEVANY_CONTROL"}
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(XDG_RUNTIME_DIR=str(self.runtime), JEVANY_LOG_LEVEL="INFO", HF_HUB_OFFLINE="1")
        with open(self.log, "wb") as out:
            # a frozen worker must not count as hung while a test holds it
            self.proc = subprocess.Popen([sys.executable, "-m", "jevany_daemon", "serve", "--model", str(model),
                                          "--heartbeat-timeout", "60"], stdout=out, stderr=subprocess.STDOUT,
                                         env=env)

    def status(self) -> dict:
        with JevClient(self.endpoint, timeout=30, retries=0) as client:
            return client.status()

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            with JevClient(self.endpoint, timeout=0.5, retries=0) as client:
                return client.status()["state"] == "ready"
        except TimeoutError:
            return False


@pytest.fixture(scope="module")
def default_daemon(tiny_model):
    daemon = DefaultDaemon(tiny_model("qwen3", "pointer"))
    try:
        wait_for(daemon.ready, READY_WITHIN_S, "the daemon ready on its default endpoint", poll_s=0.1)
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(10)
        shutil.rmtree(daemon.runtime, ignore_errors=True)


def test_the_default_socket_directory_is_created_0700(default_daemon):
    assert not default_daemon.runtime.stat().st_mode & 0o077       # made by the test, private anyway
    assert stat.S_IMODE(default_daemon.sockets.stat().st_mode) == 0o700
    assert default_daemon.sockets.stat().st_uid == os.getuid()
    assert stat.S_IMODE((default_daemon.sockets / "control.sock").stat().st_mode) == 0o600
    assert default_daemon.status()["endpoints"] == [default_daemon.endpoint]


def test_a_second_signal_answers_the_queue_shutting_down_at_once(default_daemon):
    daemon = default_daemon
    [worker] = daemon.status()["workers"]
    with Raw(daemon.endpoint) as raw:
        with frozen(worker["pid"]):
            for i, body in enumerate(BODIES[:4]):
                raw.send(i, "decide", body)
            wait_for(lambda: daemon.status()["queue"]["depth"] == 3, 30, "one request held, three queued")
            daemon.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: daemon.status()["state"] == "draining", 30, "the first signal's drain")
            assert daemon.status()["queue"]["depth"] == 3                 # the first signal keeps the queue
            raw.send("new", "decide", BODIES[4])
            refused = raw.recv()
            assert (refused["id"], refused["error"]["code"]) == ("new", "shutting_down")
            daemon.proc.send_signal(signal.SIGTERM)
            queued = [raw.recv() for _ in range(3)]                       # while the worker is still frozen
        held = raw.recv()
    assert sorted(r["id"] for r in queued) == [1, 2, 3]
    assert {r["error"]["code"] for r in queued} == {"shutting_down"}
    assert all(r["error"]["retryable"] for r in queued)
    assert held["id"] == 0 and held["ok"]                                 # what the worker held is answered
    assert daemon.proc.wait(STOP_WITHIN_S) == 0
    assert not (daemon.sockets / "daemon.sock").exists() and not (daemon.sockets / "control.sock").exists()
    assert daemon.log.read_text().count("event=drain ") == 1


# --- a daemon whose workers hang or die -----------------------------------------------------------

@pytest.fixture(scope="module")
def triggers(tmp_path_factory):
    return tmp_path_factory.mktemp("triggers")


@pytest.fixture(scope="module")
def fragile(tiny_model, triggers):
    # 3 s of silence is a hang: short for the test, long enough not to catch a busy worker by mistake
    with running_daemon(tiny_model("qwen3", "pointer"), "--heartbeat-timeout", "3", "--metrics-port", "0",
                        env=fault_env(triggers)) as d:
        yield d


def restarts(daemon) -> dict:
    with urllib.request.urlopen(daemon.status()["metrics"], timeout=10) as response:
        text = response.read().decode()
    return {s.labels["cause"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "jevany_worker_restarts_total"}


def test_a_silent_worker_is_replaced_and_counted_as_hung(fragile):
    before = restarts(fragile)
    worker = serving_worker(fragile)
    os.kill(worker["pid"], signal.SIGSTOP)       # never resumed: the daemon kills it
    new = wait_for(lambda: (w := serving_worker(fragile))["pid"] != worker["pid"] and w["state"] == "idle" and w,
                   60, "a replacement for the silent worker")
    assert new["restarts"] == worker["restarts"] + 1
    assert restarts(fragile) == {"hung": before["hung"] + 1, "died": before["died"]}
    assert "event=worker_hung" in fragile.log.read_text()


def test_replacements_that_die_three_times_before_loading_stop_the_daemon(fragile, triggers):
    restarted_before = fragile.log.read_text().count("event=worker_restart ")
    (triggers / "exit_before_load").write_text("")     # every worker started from now on exits at once
    os.kill(serving_worker(fragile)["pid"], signal.SIGKILL)
    assert fragile.proc.wait(STOP_WITHIN_S) == 1
    log = fragile.log.read_text()
    # the killed worker's replacement, then two more: three deaths before loading, then the stop
    assert log.count("event=worker_restart ") - restarted_before == 3
    assert "exited before loading the model (exit code 1)" in log
    assert "event=failed" in log and "event=stop exit_code=1" in log
    assert not fragile.socket.exists()
