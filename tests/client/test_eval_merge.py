"""merge() called in process: the merged file's order and mode, and outcomes that must agree.

(The command line's merge, shards and exit codes: test_eval_shards.py.)"""
import json
import stat

import pytest

from jevany_client.answers import shape_answer
from jevany_client.eval.errors import EvalError
from jevany_client.eval.merge import merge
from jevany_client.eval.results import answer_record, error_record, record_line
from jevany_client.eval.suite import read_suite

from .test_eval_metrics import NOUL


@pytest.fixture
def suite(tmp_path) -> str:
    path = tmp_path / "suite.jsonl"
    path.write_text("".join(json.dumps({"state": s, "questions": {"u": NOUL}, "labels": {"u": True}}) + "\n"
                            for s in range(4)))
    return str(path)


def results(path, items, code="internal") -> str:
    path.write_bytes(b"".join(record_line(error_record(i, code, code)) for i in items))
    return str(path)


def test_the_merged_file_is_every_items_line_in_index_order_readable_by_all(suite, tmp_path):
    items = read_suite(suite)
    a, b = results(tmp_path / "a.jsonl", [items[3], items[0]]), results(tmp_path / "b.jsonl", [items[2], items[1]])
    out = tmp_path / "merged.jsonl"
    assert merge(suite, [a, b], str(out), echo=lambda line: None) == 0
    assert [json.loads(line)["index"] for line in out.read_text().splitlines()] == [0, 1, 2, 3]
    assert stat.S_IMODE(out.stat().st_mode) == 0o644          # as a run's results file, whatever mkstemp made
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".merge-")] == []


def test_the_same_item_with_other_error_codes_is_refused_and_nothing_written(suite, tmp_path):
    items = read_suite(suite)
    a = results(tmp_path / "a.jsonl", items[:2], "internal")
    b = results(tmp_path / "b.jsonl", items[1:], "worker_lost")
    out = tmp_path / "merged.jsonl"
    with pytest.raises(EvalError, match=r"index 1 has different outcomes in .*a.jsonl and .*b.jsonl: "
                                        r"the error internal against the error worker_lost"):
        merge(suite, [a, b], str(out), echo=lambda line: None)
    assert not out.exists()


def answered(path, items, model: str) -> str:
    """Each item answered alike (u: true at 0.8) by `model`."""
    def line(item):
        answers = {q.qid: shape_answer(q, [0.2, 0.8]) for q in item.request.questions}
        record = answer_record(item, {"model": model, "answers": answers, "latency_ms": 5.0})
        assert "result" in record
        return record_line(record)
    path.write_bytes(b"".join(map(line, items)))
    return str(path)


def test_the_same_answers_from_another_model_are_another_outcome_and_nothing_is_written(suite, tmp_path):
    # Results from two models are two runs' results, not one run's shards: alike answers do not make them one.
    items = read_suite(suite)
    out = tmp_path / "merged.jsonl"
    a = answered(tmp_path / "a.jsonl", items[:2], "jev-1")
    assert merge(suite, [a, answered(tmp_path / "b.jsonl", items[1:], "jev-1")], str(out), echo=lambda line: None) == 0
    out.unlink()
    with pytest.raises(EvalError, match=r"index 1 has different outcomes in .*a.jsonl and .*c.jsonl"):
        merge(suite, [a, answered(tmp_path / "c.jsonl", items[1:], "jev-2")], str(out), echo=lambda line: None)
    assert not out.exists()


def test_the_same_error_code_with_other_messages_is_one_outcome(suite, tmp_path):
    # A message may say what differed between two runs of one item (the seconds a deadline gave, a retry's
    # count); the code is the outcome, so a shard run twice merges.
    items = read_suite(suite)
    for name, seconds, part in (("a.jsonl", 30.1, items[:2]), ("b.jsonl", 29.8, items[1:])):
        (tmp_path / name).write_bytes(b"".join(
            record_line(error_record(i, "deadline_exceeded", f"no answer within {seconds} s")) for i in part))
    out = tmp_path / "merged.jsonl"
    assert merge(suite, [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")], str(out), echo=lambda line: None) == 0
    merged = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in merged] == [0, 1, 2, 3]
    assert merged[1]["error"] == {"code": "deadline_exceeded", "message": "no answer within 30.1 s"}   # the first


def test_a_merge_with_items_missing_exits_3_naming_them(suite, tmp_path):
    items = read_suite(suite)
    said = []
    assert merge(suite, [results(tmp_path / "a.jsonl", items[:2])], str(tmp_path / "m.jsonl"), echo=said.append) == 3
    assert "missing 2 items (index 2, 3)" in said[-1]
