"""The suite's items: labels as probabilities keys, what a suite line must hold, and the digest of a line."""
import json

import pytest

from jevany_client.eval.errors import EvalError
from jevany_client.eval.suite import decision, parse_item

from .test_eval_metrics import CHOICE, NOUL, SCORE


def item(line: dict, index: int = 0):
    return parse_item(json.dumps(line).encode(), index)


def test_a_label_is_named_as_its_questions_probabilities_key():
    it = item({"state": 1, "questions": {"no": NOUL, "yes": NOUL, "c": CHOICE, "s": SCORE, "free": NOUL},
               "labels": {"no": False, "yes": True, "c": "b", "s": 0}})
    questions = {q.qid: q for q in it.request.questions}
    assert [it.label_key(questions[qid]) for qid in ("no", "yes", "c", "s")] == ["false", "true", "b", "0"]
    assert [q.qid for q in it.scored()] == ["no", "yes", "c", "s"]        # `free` is asked, not scored


def test_the_digest_follows_the_line_not_its_key_order_or_index():
    line = {"state": {"a": 1, "b": 2}, "questions": {"u": NOUL}, "labels": {"u": True}}
    reordered = {"labels": {"u": True}, "questions": {"u": NOUL}, "state": {"b": 2, "a": 1}}
    assert list(json.dumps(reordered)) != list(json.dumps(line))
    assert item(line).digest == item(reordered, 5).digest
    assert item(line).digest != item({**line, "labels": {"u": False}}).digest
    assert item(line).digest != item({**line, "state": {"a": 1, "b": 3}}).digest


@pytest.mark.parametrize("labels", [{}, None, ["u"]])
def test_a_line_without_at_least_one_label_is_refused(labels):
    with pytest.raises(EvalError, match="labels: required"):
        item({"state": 1, "questions": {"u": NOUL}, "labels": labels}, 3)


def test_the_decision_is_the_first_of_equally_probable_options():
    question = item({"state": 1, "questions": {"c": CHOICE}, "labels": {"c": "a"}}).request.questions[0]
    assert decision(question, {"a": 0.2, "b": 0.4, "c": 0.4}) == "b"
    assert decision(question, {"a": 0.2, "b": 0.3, "c": 0.5}) == "c"
