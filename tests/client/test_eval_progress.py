"""The run's rate: the progress bar and the printed summary give the same figure (items finished
by this run over the seconds from its first request to its last outcome), and a run that sends
nothing, or finishes nothing, says so instead of a rate.
"""
import io
import json
import re
from collections import Counter
from pathlib import Path

from rich.console import Console

from jevany_client.eval import Options, evaluate
from jevany_client.eval.progress import ProgressBar, clock
from jevany_client.eval.runner import RunSummary

from .test_eval_metrics import NOUL

RATE = re.compile(r"([\d,]+\.\d) items/s")


def write_suite(path: Path, states: list) -> str:
    path.write_text("".join(json.dumps({"state": s, "questions": {"u": NOUL}, "labels": {"u": True}}) + "\n"
                            for s in states))
    return str(path)


def run(capsys, suite: str, endpoint: str, out: Path, **more) -> tuple[int, str, str]:
    said = []
    code = evaluate(Options(suite, endpoints=[endpoint], out=str(out), concurrency=2, **more), echo=said.append)
    return code, "\n".join(said), capsys.readouterr().err


def test_the_bar_and_the_summary_give_the_same_rate_and_a_run_with_nothing_to_send_gives_none(
        tmp_path, daemon, capsys):
    # {"delay": S}: the fake echoes it S seconds late (an echo is an invalid_answer: still a final outcome).
    suite = write_suite(tmp_path / "suite.jsonl", [{"delay": 0.05, "n": n} for n in range(8)])
    out = tmp_path / "results.jsonl"
    code, said, bar = run(capsys, suite, daemon.endpoint, out, progress=True)
    assert code == 0, said
    sent = re.search(r"8 items finished by this run in ([\d.]+) s of sending: ([\d,]+\.\d) items/s "
                     r"\(from its first request to its last outcome\)", said)
    assert sent, said
    assert RATE.findall(bar)[-1:] == [sent[2]], bar           # the bar's final figure is the summary's
    assert 0.1 <= float(sent[1]) < 5 and float(sent[2]) <= 8 / 0.1 * 1.05   # four rounds of 50 ms at least

    code, said, bar = run(capsys, suite, daemon.endpoint, out, progress=True)
    assert code == 0, said
    assert f"nothing to send: all 8 items already have their outcome in {out}" in said
    assert "items/s" not in said + bar and "finished by this run" not in said


def test_a_run_that_finishes_nothing_says_so_instead_of_a_rate(tmp_path, daemon, capsys):
    suite = write_suite(tmp_path / "suite.jsonl", ["error:overloaded"])     # retryable, every time
    code, said, _ = run(capsys, suite, daemon.endpoint, tmp_path / "results.jsonl", patience=0.3, progress=False)
    assert code == 3, said
    assert "no item finished by this run, so no rate (tried again after: overloaded " in said, said
    assert "items/s" not in said


def test_the_eta_is_hours_minutes_and_seconds():
    assert clock(3725) == "1:02:05"
    assert clock(59.6) == "0:01:00"
    assert clock(36000 + 59 * 60) == "10:59:00"


def test_a_resumed_runs_bar_counts_the_items_done_before_it():
    out = io.StringIO()
    with ProgressBar(10, 4, console=Console(file=out, width=120)) as bar:
        bar.update(RunSummary(finished=2, errors=Counter(internal=1), sending_since=0.0, last_outcome_at=1.0))
    assert re.search(r"\b6/10\b", out.getvalue()), out.getvalue()
    assert "2.0 items/s ETA 0:00:02" in out.getvalue()          # the 4 left at this run's rate
    assert "1 errors, 0 retried" in out.getvalue()
