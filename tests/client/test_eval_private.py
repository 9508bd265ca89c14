"""jevany-eval --serve says it is starting its daemon, that it is still waiting for it while it loads,
and how long it took, before the progress bar starts. The daemon here is the fake one, started late.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jevany_client.eval import Options, evaluate
from jevany_client.eval import private
from jevany_client.eval.errors import EvalError

from .conftest import FAKE_DAEMON
from .test_eval_metrics import NOUL

# Stands in for `jevany-daemon serve ARGS --bind E --control ""`: loads for --load-s seconds, then serves at E.
SLOW_DAEMON = """
import os, sys, time
args = sys.argv[1:]
time.sleep(float(args[args.index("--load-s") + 1]))
os.execv(sys.executable, [sys.executable, {fake!r}, args[args.index("--bind") + 1]])
"""


def slow_daemon(tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "slow_daemon.py"
    script.write_text(SLOW_DAEMON.format(fake=str(FAKE_DAEMON)))
    monkeypatch.setattr(private, "_daemon_command", lambda: [sys.executable, str(script)])


def test_a_private_daemon_is_announced_waited_for_aloud_and_timed(tmp_path, monkeypatch):
    slow_daemon(tmp_path, monkeypatch)
    monkeypatch.setattr(private, "NOTE_AFTER_S", 0.4)
    monkeypatch.setattr(private, "NOTE_EVERY_S", 0.4)
    said = []
    with private.PrivateDaemon("--load-s 1.5", str(tmp_path / "d.log"), 30, say=said.append):
        pass
    assert said[0] == ("starting a daemon for this run (jevany-daemon serve --load-s 1.5): waiting for it to load; "
                       f"its log: {tmp_path / 'd.log'}")
    waiting = said[1:-1]
    assert 2 <= len(waiting) <= 4, said                    # at 0.4, 0.8, 1.2 s (and 1.6 on a slow start)
    assert all(re.fullmatch(r"still waiting for the daemon to load: \d+ s of 30 s \(--serve-timeout\); its log: .*",
                            line) for line in waiting), said
    ready = re.fullmatch(r"daemon ready in ([\d.]+) s", said[-1])
    assert ready and float(ready[1]) >= 1.5, said


def test_the_run_says_its_daemon_is_ready_before_the_bar_starts(tmp_path, monkeypatch, capsys):
    slow_daemon(tmp_path, monkeypatch)
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"state": n, "questions": {"u": NOUL}, "labels": {"u": True}}) + "\n"
                             for n in range(3)))
    code = evaluate(Options(str(suite), serve="--load-s 0.5", out=str(tmp_path / "results.jsonl")), echo=print)
    assert code == 0
    err = capsys.readouterr().err
    starting, ready, bar = err.find("starting a daemon for this run"), err.find("daemon ready in "), err.find("eval ")
    assert -1 < starting < ready < bar, err
    assert "still waiting" not in err                        # a load under NOTE_AFTER_S gets no such line


@pytest.mark.parametrize("args, flag", [("--bind ipc:///tmp/x.sock", "--bind"), ("--bind=tcp://127.0.0.1:5", "--bind"),
                                        ("--model m --control tcp://x:1", "--control"), ("--control=", "--control")])
def test_the_socket_options_are_jevany_evals_however_they_are_written(tmp_path, args, flag):
    with pytest.raises(EvalError, match=f"--serve: {flag} is chosen by jevany-eval"):
        private.PrivateDaemon(args, str(tmp_path / "d.log"), 30)


def test_the_daemon_log_sits_beside_the_results_named_after_them():
    assert private.log_path_for("runs/suite.results.jsonl") == "runs/suite.results.daemon.log"
    assert private.log_path_for("runs/out.txt") == "runs/out.txt.daemon.log"


def test_a_daemon_that_exits_while_loading_is_reported_with_its_exit_code_and_log(tmp_path, monkeypatch):
    code = "import sys; print('no model here', flush=True); sys.exit(3)"
    monkeypatch.setattr(private, "_daemon_command", lambda: [sys.executable, "-c", code])
    # A bound well past the exit: without the exit check the wait would run it out and say "not ready".
    with pytest.raises(EvalError, match=r"exited 3 before it was ready; .*\n.*no model here"):
        with private.PrivateDaemon("", str(tmp_path / "d.log"), 5, say=lambda line: None):
            pass


# Stands in for a draining daemon: ready once its handler is set, it notes the SIGTERM and exits 0.
DRAINING = """
import pathlib, signal, sys
def drain(*_):
    pathlib.Path(sys.argv[1]).write_text("drained")
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
print("ready", flush=True)
while True:
    signal.pause()
"""


def test_at_exit_the_daemon_gets_sigterm_which_drains_it_and_its_directory_goes(tmp_path):
    daemon = private.PrivateDaemon("", str(tmp_path / "d.log"), 30, say=lambda line: None)
    marker = tmp_path / "drained"
    daemon.proc = subprocess.Popen([sys.executable, "-c", DRAINING, str(marker)], stdout=subprocess.PIPE)
    try:
        assert daemon.proc.stdout.readline() == b"ready\n"
        daemon.stop()
    finally:
        daemon.proc.kill()
        daemon.proc.wait()
        daemon.proc.stdout.close()
    assert marker.read_text() == "drained" and daemon.proc.returncode == 0
    assert not daemon.dir.exists()
