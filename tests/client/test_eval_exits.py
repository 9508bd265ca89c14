"""jevany-eval's early exits, the real command against fake daemons: exit 3 when the daemon stays
unavailable past --patience, 130 on Ctrl-C, each keeping what finished for a rerun to complete;
and the pause between tries of one item, doubling up to 2 s.
"""
import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from jevany_client import JevClient
from jevany_client.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    JevTimeoutError,
    OverloadedError,
    ShuttingDownError,
    WorkerLostError,
)
from jevany_client.eval import runner as runner_module
from jevany_client.eval.results import ResultsLog
from jevany_client.eval.runner import Runner
from jevany_client.eval.suite import read_suite
from tests.server.daemons import wait_for

from .conftest import fake_daemon
from .test_eval_metrics import NOUL

BIN = Path(sys.executable).parent
RUN_WITHIN_S = 60      # one jevany-eval run, start-up included, on a loaded machine
STOP_WITHIN_S = 15     # from SIGINT to the exit


def write_suite(path: Path, states: list) -> Path:
    path.write_text("".join(json.dumps({"state": s, "questions": {"u": NOUL}, "labels": {"u": True}}) + "\n"
                            for s in states))
    return path


def eval_command(suite: Path, endpoint: str, out: Path, *more: str) -> list[str]:
    return [str(BIN / "jevany-eval"), str(suite), "--endpoint", endpoint, "--out", str(out),
            "--no-progress", *more]


def run_eval(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(eval_command(*args, **kwargs), capture_output=True, text=True, timeout=RUN_WITHIN_S)


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def records(path: Path) -> list[dict]:
    data = path.read_text()
    assert data == "" or data.endswith("\n"), "a torn last line"
    return [json.loads(line) for line in data.splitlines()]


def test_a_daemon_that_stays_overloaded_past_patience_ends_the_run_with_exit_3(tmp_path, daemon):
    # The fake answers "error:CODE" with that error every time; an echo has no answers (invalid_answer).
    suite = write_suite(tmp_path / "suite.jsonl",
                        [{"echo": 0}, "error:overloaded", "error:invalid_request", "error:overloaded"])
    out, report = tmp_path / "results.jsonl", tmp_path / "report.json"
    done = run_eval(suite, daemon.endpoint, out, "--patience", "1", "--report", str(report))
    assert done.returncode == 3, done.stdout + done.stderr
    said = done.stdout
    stopped = re.search(r"stopped early: no item finished for (\d+)s \(--patience 1\); "
                        r"the last failure: overloaded: fake overloaded; 2 items not done", said)
    assert stopped, said
    assert int(stopped[1]) >= 1                           # not before the patience ran out
    retried = re.search(r"tried again after: overloaded (\d+)\)", said)
    assert retried and int(retried[1]) >= 2, said         # both items tried again
    written = records(out)
    assert sorted(r["index"] for r in written) == [0, 2]  # nothing made up for the overloaded items
    assert {r["index"]: r["error"]["code"] for r in written} == {0: "invalid_answer", 2: "invalid_request"}
    assert json.loads(report.read_text())["items"] == {"answered": 0, "errors": 2, "not_done": 2}


def test_items_left_past_patience_are_finished_by_a_rerun_and_nothing_else_is_sent_again(tmp_path, socket_dir,
                                                                                         beta):
    # {"keep_on": NAME}: never answered by the fake called NAME (the client times out, a retryable
    # failure), echoed at once by any other.
    suite = write_suite(tmp_path / "suite.jsonl",
                        [{"n": 0}, {"keep_on": "mute"}, {"n": 2}, {"keep_on": "mute", "n": 3}, {"n": 4}])
    out = tmp_path / "results.jsonl"
    with fake_daemon(socket_dir, "mute") as mute:
        first = run_eval(suite, mute.endpoint, out, "--patience", "1", "--timeout", "1")
    assert first.returncode == 3, first.stdout + first.stderr
    assert "the last failure: timeout: " in first.stdout and "2 items not done" in first.stdout, first.stdout
    kept = out.read_bytes()
    assert sorted(r["index"] for r in records(out)) == [0, 2, 4]

    with JevClient(beta.endpoint, timeout=10) as client:
        before = client.status()["requests"]["ok"]
    again = run_eval(suite, beta.endpoint, out, "--patience", "1", "--timeout", "10")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 items finished by this run in " in again.stdout, again.stdout
    with JevClient(beta.endpoint, timeout=10) as client:
        answered = client.status()["requests"]["ok"] - before
    assert answered == 4          # the status asked above, the eval's ping and the two items left, nothing more
    assert out.read_bytes().startswith(kept)              # the first run's lines stay as written
    assert sorted(r["index"] for r in records(out)) == [0, 1, 2, 3, 4]


def test_ctrl_c_exits_130_at_once_keeping_what_finished_and_a_rerun_completes(tmp_path, socket_dir, beta):
    states = [{"n": 0}, {"n": 1}, {"n": 2}] + [{"keep_on": "holder", "n": n} for n in range(3, 7)]
    suite = write_suite(tmp_path / "suite.jsonl", states)
    out = tmp_path / "results.jsonl"
    with fake_daemon(socket_dir, "holder") as holder, JevClient(holder.endpoint, timeout=10) as client:
        # SIGINT at its default in the child: a runner started in the background by a script (scripts/mutate.py
        # under nohup, say) ignores it, the child would inherit that, and Python then never raises
        # KeyboardInterrupt, which is what a user's Ctrl-C gives.
        proc = subprocess.Popen(eval_command(suite, holder.endpoint, out, "--concurrency", "8"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            # Three answered and written, four in flight with nobody answering them.
            wait_for(lambda: proc.poll() is not None or (client.status()["kept"] == 4 and lines(out) == 3),
                     RUN_WITHIN_S, "four requests waiting and three results written", poll_s=0.05)
            assert proc.poll() is None, proc.communicate()
            proc.send_signal(signal.SIGINT)
            sent = time.monotonic()
            stdout, stderr = proc.communicate(timeout=STOP_WITHIN_S)
            stopped_s = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 130, stdout + stderr
    assert stopped_s < STOP_WITHIN_S
    assert f"interrupted: 3 of 7 items are in {out}; run the same command again to finish" in stdout, stdout
    assert "Traceback" not in stderr, stderr
    kept = out.read_bytes()
    assert sorted(r["index"] for r in records(out)) == [0, 1, 2]

    again = run_eval(suite, beta.endpoint, out)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 items finished by this run in " in again.stdout, again.stdout
    assert out.read_bytes().startswith(kept)
    assert sorted(r["index"] for r in records(out)) == list(range(7))


class _Flaky:
    """A client whose decide fails retryably a set number of times per item, then finally."""

    RETRYABLE = [OverloadedError, DeadlineExceededError, ShuttingDownError, WorkerLostError, JevTimeoutError]

    def __init__(self, failures: dict[int, int]):
        self.failures = failures

    async def decide_request(self, body: dict) -> dict:
        n = body["state"]
        if self.failures[n]:
            self.failures[n] -= 1
            raise self.RETRYABLE[self.failures[n] % len(self.RETRYABLE)]("busy")
        raise InvalidRequestError("final")


def test_the_pause_between_tries_doubles_from_100_ms_up_to_2_s_for_each_item(tmp_path, monkeypatch):
    items = read_suite(str(write_suite(tmp_path / "suite.jsonl", [0, 1])))
    pauses = []
    real_sleep = asyncio.sleep

    async def sleep(seconds):
        pauses.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(runner_module.asyncio, "sleep", sleep)
    with ResultsLog(str(tmp_path / "results.jsonl"), items) as log:
        runner = Runner(_Flaky({0: 8, 1: 3}), log, concurrency=1, patience=3600)
        summary = asyncio.run(runner.run(items))
        assert sorted(log.done) == [0, 1]
    assert summary.finished == 2 and sum(summary.retried.values()) == 11
    # Item 0 (eight failures of every retryable kind), then item 1, which starts over at 100 ms.
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0] + [0.1, 0.2, 0.4]
