"""The suite file: one decide body per line, plus the answer each labelled question expects.

A line is a JSON object: the fields of a `decide` body (docs/REQUESTS.md) and
`labels`, a map {question id: expected answer}: an option key for a choice
question, true or false for a noul one, a level index (0 = the first level)
for a score one. Questions without a label are asked but not scored. An
item's `index` is its zero-based line number, so blank lines keep the
numbering of the lines after them.
"""

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from ..schema import DecisionRequest, Question, parse_decision
from .errors import EvalError


@dataclass(frozen=True)
class Item:
    index: int
    body: dict            # the decide body, labels removed, exactly as sent
    labels: dict          # question id -> expected answer, as written in the suite
    request: DecisionRequest
    digest: str           # ties a results line to the suite line it answers

    def label_key(self, question: Question) -> str:
        """The expected answer as the key of `probabilities` ("true", "2", an option key)."""
        label = self.labels[question.qid]
        if question.type == "noul":
            return "true" if label else "false"
        return str(label)

    def scored(self) -> list[Question]:
        return [q for q in self.request.questions if q.qid in self.labels]


def read_suite(path: str) -> list[Item]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise EvalError(f"cannot read the suite {path}: {exc.strerror or exc}") from None
    items = []
    for index, line in enumerate(raw.split(b"\n")):
        if line.strip():
            items.append(parse_item(line, index, path))
    if not items:
        raise EvalError(f"{path}: the suite holds no items (one JSON object per line)")
    return items


def parse_item(line: bytes, index: int, path: str = "suite") -> Item:
    where = f"{path}:{index + 1} (index {index})"
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise EvalError(f"{where}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise EvalError(f"{where}: must be a JSON object, a decide body plus labels")
    body = {k: v for k, v in value.items() if k != "labels"}
    try:
        request = parse_decision(body)
    except InvalidRequestError as exc:
        raise EvalError(f"{where}: {exc.message}") from None
    labels = value.get("labels")
    problem = _labels_problem(labels, request)
    if problem:
        raise EvalError(f"{where}: {problem}")
    return Item(index, body, labels, request, _digest(value))


def _digest(value: dict) -> str:
    # Canonical JSON, so re-indenting or reordering keys in the suite keeps its results valid.
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _labels_problem(labels: Any, request: DecisionRequest) -> str | None:
    if not isinstance(labels, dict) or not labels:
        return "labels: required, a map {question id: expected answer} with at least one entry"
    questions = {q.qid: q for q in request.questions}
    for qid, label in labels.items():
        question = questions.get(qid)
        if question is None:
            return f"labels.{qid}: no question {qid!r} in questions"
        problem = _label_problem(question, label)
        if problem:
            return f"labels.{qid}: {problem}"
    return None


def _label_problem(q: Question, label: Any) -> str | None:
    if q.type == "choice":
        if not isinstance(label, str) or label not in q.criteria:
            return f"must be one of the options {sorted(q.criteria)[:10]}, got {label!r}"
    elif q.type == "noul":
        if not isinstance(label, bool):
            return f"must be true or false for a noul question, got {label!r}"
    elif isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < q.n_options:
        return f"must be a level index 0 to {q.n_options - 1} for a score question, got {label!r}"
    return None


def decision(question: Question, probabilities: dict) -> str:
    """The answer's decision as a probabilities key: the first most probable option, as the daemon picks."""
    keys = question.keys
    # max() keeps the first of equal values: ties go to the earlier option, as in the daemon.
    return max(keys, key=lambda k: probabilities[k])
