"""jevany-eval against a real tiny daemon: a killed run resumes, a daemon restart loses nothing.

The eval runs as a real subprocess (the installed command), killed for real.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.server.daemons import Daemon, wait_for

BIN = Path(sys.executable).parent
RUN_WITHIN_S = 300
N_ITEMS = 30
WORDS = "parcel late lost broken refund resend invoice login outage deadline".split()


class Served:
    """One tiny daemon on a fixed endpoint, which a test may restart in place."""

    def __init__(self, model: Path):
        self.model = model
        self.dir = Path(tempfile.mkdtemp(prefix="jve-"))   # ipc paths must stay short
        # One request at a time, no prefix cache: every answer is computed the same way each run,
        # so two runs' reports can be compared byte for byte.
        self.args = ("--max-batch-size", "1", "--prefix-cache", "0")
        self.daemon = self._start()

    def _start(self) -> Daemon:
        daemon = Daemon(self.dir, self.model, *self.args)
        daemon.wait_ready()
        return daemon

    @property
    def endpoint(self) -> str:
        return self.daemon.endpoint

    def restart(self) -> None:
        assert self.daemon.stop() == 0
        self.daemon = self._start()

    def close(self) -> None:
        if self.daemon.proc.poll() is None:
            self.daemon.proc.kill()
            self.daemon.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def served(tiny_model):
    served = Served(tiny_model("qwen3", "pointer"))
    yield served
    served.close()


@pytest.fixture
def suite(tmp_path):
    """N_ITEMS items of three question types, states long enough that a run takes a while."""
    lines = []
    for i in range(N_ITEMS):
        state = {"ticket": i, "text": " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(16))}
        lines.append({"state": state, "questions": {
            "action": {"type": "choice", "criteria": {"refund": None, "resend": None, "escalate": None}},
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
            "severity": {"type": "score", "criteria": ["low", "medium", "high"]}},
            "labels": {"action": ["refund", "resend", "escalate"][i % 3], "urgent": i % 2 == 0, "severity": i % 3}})
    path = tmp_path / "suite.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def start_eval(suite: Path, endpoint: str, out: Path, *more: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "jevany-eval"), str(suite), "--endpoint", endpoint, "--out", str(out),
         "--concurrency", "2", "--no-progress", *more],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    output, _ = proc.communicate(timeout=RUN_WITHIN_S)
    assert proc.returncode == 0, output
    return output


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def indices(path: Path) -> list[int]:
    return [json.loads(line)["index"] for line in path.read_text().splitlines()]


def test_a_killed_run_resumes_with_nothing_lost_or_doubled_and_the_same_report(served, suite, tmp_path):
    whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    finish(start_eval(suite, served.endpoint, whole, "--report", str(tmp_path / "whole.json")))
    assert sorted(indices(whole)) == list(range(N_ITEMS))

    proc = start_eval(suite, served.endpoint, resumed)
    wait_for(lambda: lines(resumed) >= 5 or proc.poll() is not None, RUN_WITHIN_S, "5 results written",
             poll_s=0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    written = lines(resumed)
    assert 5 <= written < N_ITEMS, f"the kill came after the run ended ({written} lines)"

    output = finish(start_eval(suite, served.endpoint, resumed, "--report", str(tmp_path / "resumed.json")))
    assert f"{N_ITEMS - written} items finished by this run in " in output
    assert sorted(indices(resumed)) == list(range(N_ITEMS))        # each index exactly once
    assert (tmp_path / "resumed.json").read_bytes() == (tmp_path / "whole.json").read_bytes()


def test_a_daemon_restart_mid_run_loses_nothing(served, suite, tmp_path):
    out = tmp_path / "results.jsonl"
    # Patience beyond a slow restart on a loaded machine: the run must wait the daemon out.
    proc = start_eval(suite, served.endpoint, out, "--patience", "300")
    try:
        wait_for(lambda: lines(out) >= 5 or proc.poll() is not None, RUN_WITHIN_S, "5 results written",
                 poll_s=0.01)
        served.restart()                                    # SIGTERM, exit 0, then a new daemon there
        # Items still to do once the new daemon is up: the run spans the restart, whether its calls
        # waited for the new daemon inside the client or came back retryable and were tried again.
        assert lines(out) < N_ITEMS, "the run ended before the daemon restarted"
        finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(N_ITEMS))
    assert all("result" in r for r in records), [r for r in records if "error" in r][:3]


def test_two_shards_one_on_a_private_daemon_merge_into_one_runs_report(served, suite, tmp_path, tiny_model):
    """Shard 0 through the shared daemon, shard 1 through a daemon of its own (--serve, the same
    settings), merged: the report is byte for byte the single run's."""
    single, shards = tmp_path / "single.jsonl", [tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"]
    small = tmp_path / "small.jsonl"                        # ten items: the private daemon's load is the cost
    small.write_text("".join(suite.read_text().splitlines(keepends=True)[:10]))
    suite = small
    finish(start_eval(suite, served.endpoint, single, "--report", str(tmp_path / "single.json")))
    finish(start_eval(suite, served.endpoint, shards[0], "--shard", "0/2"))
    serve = f"--model {tiny_model('qwen3', 'pointer')} " + " ".join(served.args)
    private = subprocess.run(
        [str(BIN / "jevany-eval"), str(suite), "--shard", "1/2", "--serve", serve, "--out", str(shards[1]),
         "--concurrency", "2", "--no-progress"], capture_output=True, text=True, timeout=RUN_WITHIN_S)
    assert private.returncode == 0, private.stdout + private.stderr
    held = [set(indices(path)) for path in shards]
    assert held[0] and held[1] and not held[0] & held[1]
    log = (tmp_path / "s1.daemon.log").read_text()
    socket_dir = Path(log.split("endpoints=ipc://", 1)[1].split()[0]).parent
    assert "event=stop exit_code=0" in log and not socket_dir.exists()     # drained, and cleaned up
    merge = subprocess.run(
        [str(BIN / "jevany-eval"), "merge", str(suite), *map(str, shards), "--out", str(tmp_path / "all.jsonl"),
         "--report", str(tmp_path / "merged.json")], capture_output=True, text=True, timeout=RUN_WITHIN_S)
    assert merge.returncode == 0, merge.stdout + merge.stderr
    assert (tmp_path / "merged.json").read_bytes() == (tmp_path / "single.json").read_bytes()
