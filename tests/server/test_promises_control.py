"""Control ops and jevany-ctl against a real daemon: reloads that overlap, fail, or meet a drain.

A reload's new worker is held before it loads (faults/sitecustomize.py, "hold_before_load"), so a
reload stays in progress exactly as long as a test needs; one that must fail gets workers that exit
before loading ("exit_before_load"). The drain test ends the module: the daemon takes no work after it.
"""
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jevany_client import InternalError
from jevany_daemon import workloads

from .daemons import wait_for
from .shared_daemons import Raw, fault_env, running_daemon

CTL = Path(sys.executable).parent / "jevany-ctl"
GOOD = workloads.short(1, seed=6)[0]


@pytest.fixture(scope="module")
def triggers(tmp_path_factory):
    return tmp_path_factory.mktemp("triggers")


@pytest.fixture(scope="module")
def daemon(tiny_model, triggers):
    with running_daemon(tiny_model("qwen3", "pointer"), "--metrics-port", "0", env=fault_env(triggers)) as d:
        yield d


def ctl(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([CTL, *args], capture_output=True, text=True, timeout=timeout)


def reloads_counted(daemon) -> dict:
    with urllib.request.urlopen(daemon.status()["metrics"], timeout=10) as response:
        text = response.read().decode()
    return {s.labels["result"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "jevany_reloads_total"}


def incoming(daemon) -> list[dict]:
    return [w for w in daemon.workers() if w["role"] == "incoming"]


def test_jevany_ctl_reads_a_real_daemon(daemon):
    status = ctl("status", "--endpoint", daemon.endpoint, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["pid"] == daemon.proc.pid
    table = ctl("status", "--endpoint", daemon.endpoint)
    assert table.returncode == 0 and f"pid {daemon.proc.pid}" in table.stdout and "state ready" in table.stdout
    ping = ctl("ping", "--endpoint", daemon.endpoint)
    assert ping.returncode == 0 and ping.stdout.startswith(f"pong from {daemon.endpoint}: version ")
    models = ctl("models", "--endpoint", daemon.endpoint, "--json")
    assert json.loads(models.stdout)["models"][0]["readout"] == "pointer"
    cleared = ctl("clear-cache", "--control", daemon.control)
    assert cleared.returncode == 0 and set(json.loads(cleared.stdout)) == {"cleared"}
    refused = ctl("drain", "--control", daemon.endpoint)        # the public endpoint takes no control op
    assert refused.returncode == 1 and "forbidden" in refused.stderr
    assert daemon.status()["state"] == "ready"


def test_reloads_asked_together_share_one_outcome_and_ctl_waits_for_it(daemon, triggers):
    generation = daemon.status()["reload"]["serving_generation"]
    hold = triggers / "hold_before_load"
    hold.write_text("")
    try:
        with Raw(daemon.control) as raw:
            raw.send("first", "reload")
            wait_for(lambda: daemon.status()["reload"]["in_progress"], 30, "status saying a reload is in progress")
            assert [w["state"] for w in incoming(daemon)] == ["starting"]
            raw.send("second", "reload")
            waiting = subprocess.Popen([CTL, "reload", "--control", daemon.control, "--wait", "120"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            impatient = ctl("reload", "--control", daemon.control, "--wait", "0.5")
            assert impatient.returncode == 2
            assert "the daemon took reload but did not finish it within 0.5s" in impatient.stderr
            assert daemon.status()["reload"]["in_progress"] is True and len(incoming(daemon)) == 1
            hold.unlink()
            replies = [raw.recv(120), raw.recv(120)]
        out, err = waiting.communicate(timeout=120)
    finally:
        hold.unlink(missing_ok=True)
    assert waiting.returncode == 0, err
    assert sorted(r["id"] for r in replies) == ["first", "second"] and all(r["ok"] for r in replies)
    first, second = (r["result"] for r in replies)
    assert first == second == json.loads(out)                       # one reload, one outcome for all three
    assert first["reloaded"] is True and first["generation"] == generation + 1
    status = daemon.status()
    assert status["reload"]["in_progress"] is False and status["reload"]["last"] == first
    assert status["reload"]["serving_generation"] == generation + 1
    assert daemon.log.read_text().count("event=reload ") == 1 + generation


def test_a_reload_whose_workers_die_before_loading_fails_keeps_serving_and_is_counted(daemon, triggers):
    before = reloads_counted(daemon)
    serving = daemon.status()["reload"]["serving_generation"]
    (triggers / "exit_before_load").write_text("")
    try:
        with daemon.control_client(timeout=120) as control:
            with pytest.raises(InternalError, match=r"reload failed: .*exit code 1.*; still serving"):
                control.reload()
    finally:
        (triggers / "exit_before_load").unlink()
    after = reloads_counted(daemon)
    assert after["failed"] == before["failed"] + 1 and after["ok"] == before["ok"]
    status = daemon.status()
    assert status["reload"]["serving_generation"] == serving and status["reload"]["last"]["reloaded"] is False
    with daemon.client(timeout=60) as client:
        assert client.call("decide", GOOD)["answers"]


def test_a_reload_meeting_a_drain_is_answered_shutting_down_and_counted(daemon, triggers):
    before = reloads_counted(daemon)
    hold = triggers / "hold_before_load"
    hold.write_text("")
    try:
        with Raw(daemon.control) as raw:
            raw.send("reload", "reload")
            wait_for(lambda: daemon.status()["reload"]["in_progress"], 30, "a reload in progress")
            raw.send("drain", "drain")                      # the drain abandons the reload
            replies = {r["id"]: r for r in (raw.recv(60), raw.recv(60))}
            raw.send("again", "reload")                     # and a reload once drained is refused
            again = raw.recv(60)
    finally:
        hold.unlink(missing_ok=True)
    assert replies["drain"]["ok"] and replies["drain"]["result"] == {"state": "drained"}
    abandoned = replies["reload"]["error"]
    assert abandoned["code"] == "shutting_down" and abandoned["retryable"] is True
    assert abandoned["message"].startswith("reload failed: the daemon began draining; still serving")
    assert again["error"]["code"] == "shutting_down"
    assert again["error"]["message"] == "reload refused: the daemon is drained"
    after = reloads_counted(daemon)
    assert (after["failed"], after["refused"]) == (before["failed"] + 1, before["refused"] + 1)
    status = daemon.status()
    assert status["state"] == "drained" and status["reload"]["in_progress"] is False
    assert [w["role"] for w in status["workers"]] == ["serving"]     # the half-started generation is gone
