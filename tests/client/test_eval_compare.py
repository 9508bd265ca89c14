"""jevany-eval --compare on two result files with known differences, and the command line's refusals."""
import json
import math
import re
import sys

import pytest
from typer.testing import CliRunner

from jevany_client.cli import client_app, eval_app
from jevany_client.eval.compare import EXAMPLES, compare_runs, nan_aware_max
from jevany_client.eval.results import error_record

from .test_eval_metrics import CHOICE, NOUL, answered, suite_items

LINES = [{"state": i, "questions": {"q": CHOICE, "u": NOUL}, "labels": {"q": "a", "u": True}} for i in range(4)]
# This run: item 0 q right, item 1 q wrong; u right everywhere. The other run moves item 1's q
# to the right answer (one decision changed, |dp| .5 on two options) and item 2's u by .1.
THIS = [{"q": [0.6, 0.3, 0.1], "u": [0.2, 0.8]},
        {"q": [0.1, 0.7, 0.2], "u": [0.2, 0.8]},
        {"q": [0.6, 0.3, 0.1], "u": [0.3, 0.7]},
        {"q": [0.6, 0.3, 0.1], "u": [0.2, 0.8]}]
OTHER = [THIS[0], {"q": [0.6, 0.2, 0.2], "u": [0.2, 0.8]}, {"q": [0.6, 0.3, 0.1], "u": [0.2, 0.8]}, THIS[3]]


@pytest.fixture
def runs():
    items = suite_items(LINES)
    this, other = answered(items, THIS), answered(items, OTHER)
    other[3] = error_record(items[3], "context_length_exceeded", "too long")   # answered here only
    return items, this, other


def test_compare_counts_changed_decisions_and_probability_shifts(runs):
    items, this, other = runs
    c = compare_runs(items, this, other)
    assert c["items"] == {"both_answered": 3, "this_only": 1, "other_only": 0}
    assert c["decisions"]["questions"] == 6
    assert c["decisions"]["changed"] == 1
    assert c["decisions"]["examples"] == [{"index": 1, "question": "q", "this": "b", "other": "a"}]
    # |dp| over every option of the 3 shared items: item 1 q (.5, .5, 0), item 2 u (.1, .1), the rest 0;
    # 3 items x (3 + 2) options = 15 values, summing to 1.2.
    assert c["probabilities"]["max_abs_diff"] == pytest.approx(0.5)
    assert c["probabilities"]["mean_abs_diff"] == pytest.approx(1.2 / 15)


def test_compare_gives_paired_metric_differences(runs):
    items, this, other = runs
    paired = compare_runs(items, this, other)["paired"]
    choice = paired["choice"]
    # Items 0-2 answered by both: this run is right on 2 of 3 choices, the other on 3 of 3.
    assert choice["questions"] == 3
    assert choice["accuracy"]["this"] == pytest.approx(2 / 3) and choice["accuracy"]["other"] == 1.0
    assert choice["accuracy"]["diff"] == pytest.approx(-1 / 3)
    # NLL: this -ln(.6) -ln(.1) -ln(.6), the other -ln(.6) x3: the difference is (ln .6 - ln .1)/3.
    assert choice["nll"]["diff"] == pytest.approx((math.log(0.6) - math.log(0.1)) / 3)
    low, high = choice["accuracy"]["ci95"]
    assert low <= choice["accuracy"]["diff"] <= high and low < 0
    assert paired["noul"]["accuracy"]["diff"] == 0.0
    assert paired["noul"]["accuracy"]["ci95"] == [0.0, 0.0]      # both runs right on every draw


def test_a_run_compared_with_itself_differs_by_exactly_zero_on_every_draw(runs):
    # Accuracy varies from draw to draw (item 1 is wrong), but a paired draw reweights the same
    # items in both runs, so every difference, and so every interval, is exactly zero.
    items, this, _ = runs
    c = compare_runs(items, this, this)
    assert c["decisions"]["changed"] == 0 and c["probabilities"]["max_abs_diff"] == 0.0
    for section in c["paired"].values():
        for metric in ("accuracy", "nll", "brier", "ece"):
            assert section[metric]["diff"] == 0.0 and section[metric]["ci95"] == [0.0, 0.0], metric


def test_the_largest_difference_is_nan_when_any_is():
    assert nan_aware_max([0.0, math.nan, 1e-9]) != nan_aware_max([0.0, math.nan, 1e-9])   # NaN
    assert math.isnan(nan_aware_max([math.nan, 0.5]))
    assert nan_aware_max([0.1, 0.5, 0.2]) == 0.5
    assert nan_aware_max([]) is None


def write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_the_command_compares_finished_runs_without_a_daemon(tmp_path, runs):
    items, this, other = runs
    suite = write(tmp_path / "suite.jsonl", LINES)
    mine = write(tmp_path / "mine.jsonl", [this[i] for i in (3, 1, 0, 2)])    # arrival order
    theirs = write(tmp_path / "theirs.jsonl", [other[i] for i in range(4)])
    report = tmp_path / "report.json"
    result = CliRunner().invoke(eval_app, [suite, "--out", mine, "--compare", theirs, "--report", str(report),
                                           "--endpoint", f"ipc://{tmp_path}/nobody.sock"])
    assert result.exit_code == 0, result.output
    assert "decisions changed: 1 of 6 questions" in result.stdout
    assert "4 items: 4 answered, 0 errors" in result.stdout
    written = json.loads(report.read_text())
    assert written["compare"]["decisions"]["changed"] == 1
    assert written["compare"]["probabilities"]["max_abs_diff"] == 0.5


@pytest.mark.parametrize("args, message", [
    (["missing.jsonl"], r"error: cannot read the suite missing.jsonl: No such file"),
    (["bad.jsonl"], r"error: bad.jsonl:2 \(index 1\): labels.u: must be true or false"),
    (["suite.jsonl", "--endpoint", "ipc://{tmp}/nobody.sock"], r"error: no daemon at {tmp}/nobody.sock: no socket file there"),
    (["suite.jsonl", "--endpoint", "nonsense"], r"error: --endpoint: cannot use the endpoint 'nonsense': endpoints are ipc://"),
    (["suite.jsonl", "--endpoint", "tcp://127.0.0.1:1", "--timeout", "0.5"],     # nobody listens on port 1
     r"error: daemon not reachable at tcp://127.0.0.1:1 within 0.5s"),
    (["suite.jsonl", "--compare", "absent.jsonl"], r"error: cannot read the results file absent.jsonl"),
])
def test_the_command_refuses_what_it_cannot_run_with_exit_2(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "suite.jsonl", LINES)
    write(tmp_path / "bad.jsonl", [LINES[0], {**LINES[1], "labels": {"u": "yes"}}])
    args = [a.format(tmp=tmp_path) for a in args]
    result = CliRunner().invoke(eval_app, args)
    assert result.exit_code == 2, result.output
    assert re.match(message.format(tmp=tmp_path), result.stderr), result.stderr


def test_asking_for_a_plot_without_matplotlib_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)    # import matplotlib fails
    suite = write(tmp_path / "suite.jsonl", LINES)
    result = CliRunner().invoke(eval_app, [suite, "--plot", str(tmp_path / "r.png"),
                                           "--endpoint", f"ipc://{tmp_path}/nobody.sock"])
    assert result.exit_code == 2
    assert "--plot needs matplotlib" in result.stderr and "jevany-client[plot]" in result.stderr
    assert not (tmp_path / "suite.results.jsonl").exists()


@pytest.mark.parametrize("name, door", [("eval", "jevany-eval"), ("eval-merge", "jevany-eval merge")])
def test_the_client_command_names_the_one_door_for_evaluating_and_runs_nothing(tmp_path, name, door):
    suite = write(tmp_path / "suite.jsonl", LINES)
    result = CliRunner().invoke(client_app, [name, suite, "--endpoint", f"ipc://{tmp_path}/nobody.sock"])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: `jevany-client {name}` is `{door}`: run `{door} --help`"
    assert name not in CliRunner().invoke(client_app, ["--help"]).output


def test_the_examples_are_the_first_changed_decisions_by_index():
    lines = [{"state": i, "questions": {"u": NOUL}, "labels": {"u": True}} for i in range(EXAMPLES + 5)]
    items = suite_items(lines)
    this = answered(items, [{"u": [0.2, 0.8]}] * len(items))
    other = answered(items, [{"u": [0.8, 0.2]}] * len(items))
    decisions = compare_runs(items, this, other)["decisions"]
    assert decisions["changed"] == EXAMPLES + 5
    assert [e["index"] for e in decisions["examples"]] == list(range(EXAMPLES))
    assert decisions["examples"][0] == {"index": 0, "question": "u", "this": "true", "other": "false"}
