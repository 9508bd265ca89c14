"""The results file's lines: what is refused as not a results line, and what counts as an error."""
import json

import pytest

from jevany_client.eval.errors import EvalError
from jevany_client.eval.results import INVALID_ANSWER, ResultsLog, error_record, is_ok, read_results

from .test_eval_metrics import NOUL, answered, suite_items

LINES = [{"state": s, "questions": {"u": NOUL}, "labels": {"u": True}} for s in range(3)]


@pytest.fixture
def items():
    return suite_items(LINES)


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_a_boolean_index_is_not_item_1(tmp_path, items):
    record = answered(items, [{"u": [0.3, 0.7]}] * 3)[1]
    with pytest.raises(EvalError, match=r"results.jsonl:1: index True is not an item"):
        read_results(write(tmp_path / "results.jsonl", [{**record, "index": True}]), items)


@pytest.mark.parametrize("drop", [(), ("result", "error")])
def test_a_line_holds_a_result_or_an_error_not_both_nor_neither(tmp_path, items, drop):
    record = {**answered(items, [{"u": [0.3, 0.7]}] * 3)[0], "error": {"code": "internal", "message": ""}}
    record = {k: v for k, v in record.items() if k not in drop}
    with pytest.raises(EvalError, match=r"results.jsonl:1: a results line is \{index, item, result\}"):
        read_results(write(tmp_path / "results.jsonl", [record]), items)


@pytest.mark.parametrize("error", [{"code": 5, "message": "m"}, {"message": "m"}, "internal"])
def test_an_error_without_a_string_code_counts_as_an_invalid_line(tmp_path, items, error):
    line = {"index": 2, "item": items[2].digest, "error": error}
    record = read_results(write(tmp_path / "results.jsonl", [line]), items)[2]
    assert record["error"]["code"] == "invalid_results_line" and not is_ok(record)


def test_a_result_failing_the_self_check_is_read_as_invalid_answer(tmp_path, items):
    line = {"index": 0, "item": items[0].digest, "result": {"answers": {"u": {"probabilities": {"true": 2}}}}}
    assert read_results(write(tmp_path / "results.jsonl", [line]), items)[0]["error"]["code"] == INVALID_ANSWER


def test_what_is_appended_is_done_and_read_back_after(tmp_path, items):
    path = str(tmp_path / "results.jsonl")
    with ResultsLog(path, items) as log:
        assert log.done == {}
        log.append(error_record(items[1], "internal", "boom"))
        assert list(log.done) == [1] and log.done[1]["error"]["code"] == "internal"
    with ResultsLog(path, items) as log:
        assert list(log.done) == [1]


def test_blank_lines_between_results_are_kept_and_nothing_is_cut(tmp_path, items):
    records = answered(items, [{"u": [0.3, 0.7]}] * 3)
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(records[0]) + "\n\n  \n" + json.dumps(records[1]) + "\n")
    whole = path.read_bytes()
    with ResultsLog(str(path), items) as log:
        assert sorted(log.done) == [0, 1]
        assert path.read_bytes() == whole
        log.append(records[2])
    assert sorted(read_results(str(path), items)) == [0, 1, 2]


def test_a_whole_last_line_without_its_newline_gets_one_before_the_next_is_appended(tmp_path, items):
    # A run killed between a line and its newline leaves a whole result: resuming keeps it, and what it appends
    # must start a line of its own, not run on from it.
    records = answered(items, [{"u": [0.3, 0.7]}] * 3)
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(records[0]))
    with ResultsLog(str(path), items) as log:
        assert sorted(log.done) == [0]
        log.append(records[1])
    assert [json.loads(line)["index"] for line in path.read_text().splitlines()] == [0, 1]
    assert sorted(read_results(str(path), items)) == [0, 1]
