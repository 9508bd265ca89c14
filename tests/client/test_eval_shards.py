"""jevany-eval across hosts, without a daemon: shards of a suite, and merging results files.

(A sharded run through real daemons, one of them private, merged into one run's
report: tests/client/test_eval_daemon.py.)
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jevany_client.cli import eval_app, merge_app
from jevany_client.eval import EvalError
from jevany_client.eval.shards import Shard, parse_shard
from jevany_client.eval.suite import read_suite

BIN = Path(sys.executable).parent
QUESTIONS = {"urgent": {"type": "noul"}, "action": {"type": "choice", "criteria": {"refund": None, "close": None}}}


@pytest.fixture
def suite(tmp_path) -> Path:
    """24 items over 8 states, each state asked three times, interleaved as a real suite would be."""
    lines = [{"state": {"ticket": f"ticket {i % 8}", "text": "parcel late " * (i % 8)},
              "questions": QUESTIONS, "labels": {"urgent": i % 2 == 0, "action": "close"}} for i in range(24)]
    path = tmp_path / "suite.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def error_line(item, code: str) -> str:
    record = {"index": item.index, "item": item.digest, "error": {"code": code, "message": code}}
    return json.dumps(record, separators=(",", ":")) + "\n"          # as a run writes it


def test_shards_split_the_suite_once_each_and_keep_a_state_in_one_shard(suite):
    items = read_suite(str(suite))
    shards = [Shard(i, 3) for i in range(3)]
    owners = {item.index: [s.index for s in shards if s.holds(item)] for item in items}
    assert all(len(held) == 1 for held in owners.values())
    by_state = {}
    for item in items:
        by_state.setdefault(json.dumps(item.body["state"], sort_keys=True), set()).update(owners[item.index])
    assert all(len(held) == 1 for held in by_state.values())
    assert len({owner for held in owners.values() for owner in held}) >= 2


def test_every_question_about_one_state_lands_in_its_shard_whatever_it_asks(tmp_path):
    # The shard follows the state alone: a state asked different questions is still one daemon's cache.
    asks = [{"urgent": {"type": "noul"}}, QUESTIONS, {"tone": {"type": "score", "criteria": ["calm", "angry"]}},
            {"action": {"type": "choice", "criteria": {"refund": None, "wait": None}}, "urgent": {"type": "noul"}}]
    labels = {"urgent": {"urgent": True}, "tone": {"tone": 1}, "action": {"action": "wait"}}
    lines = [{"state": {"ticket": f"ticket {i % 12}"}, "questions": asks[i // 12],
              "labels": labels[next(iter(asks[i // 12]))]} for i in range(48)]
    path = tmp_path / "asks.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    items = read_suite(str(path))
    owners = {}
    for item in items:
        owners.setdefault(item.body["state"]["ticket"], set()).update(
            i for i in range(4) if Shard(i, 4).holds(item))
    assert all(len(held) == 1 for held in owners.values()), owners
    assert len(set().union(*owners.values())) >= 2


def test_a_state_written_with_its_keys_in_another_order_lands_in_the_same_shard(tmp_path):
    # The same state, its keys reordered (another tool wrote that line), is one daemon's cache all the same.
    states = [{"ticket": f"ticket {i}", "text": f"parcel late {i}", "customer": {"id": i, "tier": "gold"}}
              for i in range(16)]
    lines = [{"state": state, "questions": QUESTIONS, "labels": {"urgent": True}} for state in states]
    reordered = [{k: dict(reversed(v.items())) if isinstance(v, dict) else v for k, v in reversed(state.items())}
                 for state in states]
    lines += [{"state": state, "questions": QUESTIONS, "labels": {"urgent": False}} for state in reordered]
    assert json.dumps(lines[0]["state"]) != json.dumps(lines[16]["state"])
    path = tmp_path / "reordered.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    items = read_suite(str(path))
    owner = {item.index: [i for i in range(4) if Shard(i, 4).holds(item)] for item in items}
    assert all(owner[i] == owner[i + 16] for i in range(16)), owner
    assert len({held[0] for held in owner.values()}) >= 2


def test_the_shard_comes_from_the_option_or_the_scheduler():
    assert parse_shard("2/5") == Shard(2, 5)
    assert parse_shard("0/1") == Shard(0, 1)
    assert parse_shard("auto", {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2"}) == Shard(0, 2)
    assert parse_shard("auto", {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "4",
                                "SLURM_ARRAY_TASK_COUNT": "6"}) == Shard(3, 6)
    assert parse_shard("auto", {"JOB_COMPLETION_INDEX": "1", "JEVANY_SHARD_COUNT": "4"}) == Shard(1, 4)
    assert parse_shard(None) is None
    for bad, env, message in [("5/5", {}, "does not exist"), ("1-2", {}, "I/N"), ("auto", {}, "Slurm array task"),
                              ("x/2", {}, "I/N"), ("1/y", {}, "I/N"), ("1/", {}, "I/N"), ("-1/2", {}, "I/N"),
                              ("auto", {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "2"}, "does not exist"),
                              ("auto", {"JOB_COMPLETION_INDEX": "1"}, "JEVANY_SHARD_COUNT must be a number")]:
        with pytest.raises(EvalError, match=message):
            parse_shard(bad, env)


def test_merge_joins_shards_lists_what_is_missing_and_exits_3(suite, tmp_path):
    items = read_suite(str(suite))
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "merged.jsonl"
    a.write_text("".join(error_line(i, "internal") for i in items[:10]))
    b.write_text("".join(error_line(i, "internal") for i in items[8:20]))       # 8 and 9 in both, alike
    result = CliRunner().invoke(merge_app, [str(suite), str(a), str(b), "--out", str(out)])
    assert result.exit_code == 3, result.output
    assert "missing 4 items (index 20, 21, 22, 23)" in result.output
    merged = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in merged] == list(range(20))                      # each once, in order
    # the merged file is a results file a plain run resumes
    resumed = subprocess.run([str(BIN / "jevany-eval"), str(suite), "--out", str(out), "--endpoint",
                              f"ipc://{tmp_path}/nobody.sock", "--no-progress"], capture_output=True, text=True)
    assert resumed.returncode == 2 and "no daemon at" in resumed.stderr       # it got as far as sending
    # One item short is short: exit 3 again, naming it.
    a.write_text("".join(error_line(i, "internal") for i in items[:23]))
    result = CliRunner().invoke(merge_app, [str(suite), str(a), "--out", str(out)])
    assert result.exit_code == 3 and "missing 1 items (index 23)" in result.output, result.output


def test_merge_refuses_conflicting_duplicates_and_lines_of_another_suite_and_writes_nothing(suite, tmp_path):
    items = read_suite(str(suite))
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "merged.jsonl"
    a.write_text(error_line(items[3], "internal"))
    b.write_text(error_line(items[3], "unknown_model"))
    result = CliRunner().invoke(merge_app, [str(suite), str(a), str(b), "--out", str(out)])
    assert result.exit_code == 2
    assert "index 3 has different outcomes" in result.output and not out.exists()
    b.write_text(json.dumps({"index": 4, "item": "0" * 16, "error": {"code": "internal", "message": ""}}) + "\n")
    result = CliRunner().invoke(merge_app, [str(suite), str(a), str(b), "--out", str(out)])
    assert result.exit_code == 2 and "answered for a different suite line" in result.output
    assert not out.exists()


def test_the_installed_command_dispatches_merge_and_the_report_is_written(suite, tmp_path):
    items = read_suite(str(suite))
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(error_line(i, "internal") for i in items))
    out, report = tmp_path / "merged.jsonl", tmp_path / "report.json"
    done = subprocess.run([str(BIN / "jevany-eval"), "merge", str(suite), str(whole), "--out", str(out),
                           "--report", str(report)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["items"] == {"answered": 0, "errors": 24, "not_done": 0}
    assert out.read_bytes() == whole.read_bytes()


def test_the_help_of_jevany_eval_names_its_merge_command_and_what_it_does():
    text = CliRunner().invoke(eval_app, ["--help"]).output
    description = " ".join(text.split("Arguments:")[0].split())     # above the options: not only --shard's help
    assert "jevany-eval merge SUITE.jsonl RESULTS.jsonl... --out MERGED.jsonl joins the results files" in description
    assert "`jevany-eval merge --help`" in description


def answer_line(item, urgent: float = 0.7, model: str = "m", latency_ms: float = 12.0) -> str:
    """An answered item's line, as a run writes it."""
    from jevany_client.answers import shape_answer
    from jevany_client.eval.results import answer_record, record_line

    given = {"urgent": [1 - urgent, urgent], "action": [0.4, 0.6]}
    answers = {q.qid: shape_answer(q, given[q.qid]) for q in item.request.questions}
    record = answer_record(item, {"model": model, "answers": answers, "latency_ms": latency_ms})
    assert "result" in record
    return record_line(record).decode()


def test_merge_writes_interleaved_shards_in_suite_order_and_a_duplicate_must_answer_alike(suite, tmp_path):
    items = read_suite(str(suite))
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "merged.jsonl"
    # Shards interleave (each holds every other state), and a resumed shard's file is not in index order.
    a.write_text("".join(answer_line(i) for i in reversed(items) if i.index % 2 == 0))
    b.write_text("".join(answer_line(i, latency_ms=30.0 + i.index) for i in items if i.index % 2 == 1)
                 + answer_line(items[4], latency_ms=99.0))         # 4 again: the same answer, slower
    result = CliRunner().invoke(merge_app, [str(suite), str(b), str(a), "--out", str(out)])
    assert result.exit_code == 0, result.output
    merged = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in merged] == list(range(24))
    assert merged[4]["result"]["latency_ms"] == 99.0                  # the first file named gives the record
    # Another answer, another model, or an error where the other file answered: they disagree.
    for other in (answer_line(items[4], urgent=0.2), answer_line(items[4], model="m2"), error_line(items[4], "internal")):
        b.write_text(other)
        out.unlink(missing_ok=True)
        result = CliRunner().invoke(merge_app, [str(suite), str(a), str(b), "--out", str(out)])
        assert result.exit_code == 2 and "index 4 has different outcomes" in result.output, (other, result.output)
        assert not out.exists()
