"""jevany-eval's files: suite lines refused with their line named, and the results log's resume rules."""
import json
import pytest

from jevany_client.eval.errors import EvalError
from jevany_client.eval.results import ResultsLog, error_record, read_results
from jevany_client.eval.suite import read_suite

from .test_eval_metrics import CHOICE, NOUL, SCORE, answered

GOOD = {"state": {"t": "x"}, "questions": {"q": CHOICE, "u": NOUL, "s": SCORE},
        "labels": {"q": "b", "u": True, "s": 2}}


def write_suite(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


@pytest.mark.parametrize("bad, message", [
    ("{not json", r"suite.jsonl:2 \(index 1\): not JSON"),
    ("[1, 2]", r"suite.jsonl:2 \(index 1\): must be a JSON object"),
    ({"state": 1, "questions": {"q": CHOICE}}, r":2 \(index 1\): labels: required"),
    ({"state": 1, "questions": {"q": CHOICE}, "labels": {"q": "z"}}, r"labels.q: must be one of the options"),
    ({"state": 1, "questions": {"q": NOUL}, "labels": {"q": 1}}, r"labels.q: must be true or false"),
    ({"state": 1, "questions": {"q": SCORE}, "labels": {"q": 3}}, r"labels.q: must be a level index 0 to 2"),
    ({"state": 1, "questions": {"q": SCORE}, "labels": {"q": True}}, r"labels.q: must be a level index"),
    ({"state": 1, "questions": {"q": NOUL}, "labels": {"other": True}}, r"labels.other: no question 'other'"),
    ({"questions": {"q": NOUL}, "labels": {"q": True}}, r":2 \(index 1\): state: is required"),
    ({"state": 1, "questions": {"q": {"type": "poll"}}, "labels": {"q": True}}, r"questions.q.type: must be one of"),
])
def test_a_bad_suite_line_is_refused_naming_its_line(tmp_path, bad, message):
    path = write_suite(tmp_path / "suite.jsonl", [GOOD, bad, GOOD])
    with pytest.raises(EvalError, match=message):
        read_suite(path)


def test_items_are_numbered_by_line_and_blank_lines_keep_the_numbering(tmp_path):
    items = read_suite(write_suite(tmp_path / "suite.jsonl", [GOOD, "", GOOD]))
    assert [i.index for i in items] == [0, 2]
    assert "labels" not in items[0].body and items[0].labels == GOOD["labels"]
    assert items[0].digest == items[1].digest       # same line, same digest


def test_a_missing_or_empty_suite_is_an_error(tmp_path):
    with pytest.raises(EvalError, match="cannot read the suite .*nothing.jsonl"):
        read_suite(str(tmp_path / "nothing.jsonl"))
    with pytest.raises(EvalError, match="holds no items"):
        read_suite(write_suite(tmp_path / "empty.jsonl", [""]))


@pytest.fixture
def three(tmp_path):
    return read_suite(write_suite(tmp_path / "suite.jsonl", [GOOD, {**GOOD, "state": 2}, {**GOOD, "state": 3}]))


P = {"q": [0.2, 0.5, 0.3], "u": [0.4, 0.6], "s": [0.1, 0.2, 0.7]}


def test_a_torn_last_line_is_cut_off_and_its_item_runs_again(tmp_path, three):
    path = tmp_path / "results.jsonl"
    records = answered(three, [P, P, P])
    with ResultsLog(str(path), three) as log:
        log.append(records[0])
        log.append(records[1])
    whole = path.read_bytes()
    path.write_bytes(whole + json.dumps(records[2]).encode()[:40])     # a kill mid-write
    assert set(read_results(str(path), three)) == {0, 1}                # read-only: left out
    with ResultsLog(str(path), three) as log:
        assert set(log.done) == {0, 1}
        assert path.read_bytes() == whole                               # cut off before appending
        log.append(records[2])
    assert [json.loads(line)["index"] for line in path.read_text().splitlines()] == [0, 1, 2]


def test_a_whole_last_line_without_its_newline_is_kept(tmp_path, three):
    path = tmp_path / "results.jsonl"
    records = answered(three, [P, P, P])
    path.write_text(json.dumps(records[0]))
    with ResultsLog(str(path), three) as log:
        assert set(log.done) == {0}
        log.append(records[1])
    assert [json.loads(line)["index"] for line in path.read_text().splitlines()] == [0, 1]


def test_results_that_do_not_belong_to_the_suite_are_refused(tmp_path, three):
    path = tmp_path / "results.jsonl"
    records = answered(three, [P, P, P])
    path.write_text(json.dumps({**records[1], "item": "0123456789abcdef"}) + "\n")
    with pytest.raises(EvalError, match=r"results.jsonl:1: index 1 was answered for a different suite line"):
        read_results(str(path), three)
    path.write_text(json.dumps({**records[1], "index": 7}) + "\n")
    with pytest.raises(EvalError, match="index 7 is not an item of the suite"):
        ResultsLog(str(path), three)
    path.write_text(json.dumps(records[1]) + "\n" + json.dumps(records[1]) + "\n")
    with pytest.raises(EvalError, match=r":2: index 1 is already answered on line 1"):
        read_results(str(path), three)
    path.write_text("garbage\n" + json.dumps(records[1]) + "\n")
    with pytest.raises(EvalError, match=r":1: not a JSON results line"):
        read_results(str(path), three)


def test_an_answer_that_fails_its_self_check_counts_as_an_error(tmp_path, three):
    path = tmp_path / "results.jsonl"
    record = answered(three, [P])[0]
    record["result"]["answers"]["u"]["probabilities"] = {"false": 0.9, "true": 0.9}
    path.write_text(json.dumps(record) + "\n")
    [(index, read)] = read_results(str(path), three).items()
    assert index == 0 and read["error"]["code"] == "invalid_answer"
    assert "sum to 1.8" in read["error"]["message"]


def test_a_second_writer_is_refused_while_the_first_holds_the_file(tmp_path, three):
    path = tmp_path / "results.jsonl"
    with ResultsLog(str(path), three) as log:
        log.append(error_record(three[0], "invalid_request", "bad"))
        # flock locks belong to the open file, so a second open, even in this process, is refused.
        with pytest.raises(EvalError, match="another jevany-eval is writing"):
            ResultsLog(str(path), three)
    with ResultsLog(str(path), three) as log:            # free again once closed
        assert set(log.done) == {0}
