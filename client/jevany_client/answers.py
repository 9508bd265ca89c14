"""Probabilities to JevAny answer shapes, and JevAny's self-check of an answer."""

import math
from collections.abc import Sequence
from typing import Any

from .errors import InternalError
from .render import render
from .schema import Question


def _round2(x: float) -> float:
    return round(float(x), 2)


def _first_argmax(p: Sequence[float]) -> int:
    return max(range(len(p)), key=p.__getitem__)


def shape_answer(q: Question, probs: Sequence[float]) -> dict[str, Any]:
    # float() turns numpy/torch scalars into plain floats msgpack can pack.
    p = [float(x) for x in probs]
    if len(p) != q.n_options:
        raise InternalError(
            f"question {q.qid!r} has {q.n_options} options but {len(p)} probabilities"
        )
    return _SHAPERS[q.type](q, p)


def _choice(q: Question, p: list[float]) -> dict[str, Any]:
    keys = q.keys
    k = len(p)
    confidence = 1.0 if k == 1 else (max(p) - 1 / k) / (1 - 1 / k)
    # Key order follows JevAny: output_tokens counts the serialized answers.
    return {
        "type": "choice",
        "choice": keys[_first_argmax(p)],
        "confidence": _round2(confidence),
        "probabilities": dict(zip(keys, p)),
    }


def _noul(q: Question, p: list[float]) -> dict[str, Any]:
    return {
        "type": "noul",
        "noul": _round2(p[1]),
        "probabilities": {"false": p[0], "true": p[1]},
    }


def legend_level(level: Any) -> Any:
    """A score level as its legend shows it: as sent, but a null as the text the model read (render's
    ""): the Jev API's clients refuse a null legend value (typesafe-sdk), where JevAny wrote null."""
    return render(level) if level is None else level


def _score(q: Question, p: list[float]) -> dict[str, Any]:
    keys = q.keys
    mode = _first_argmax(p)
    spread = sum(pi * abs(i - mode) for i, pi in enumerate(p))
    return {
        "type": "score",
        "score": _round2(sum(i * pi for i, pi in enumerate(p))),
        "legend": {key: legend_level(level) for key, level in zip(keys, q.criteria)},
        "probabilities": dict(zip(keys, p)),
        "confidence": _round2(1.0 - spread / (len(p) - 1)),
    }


_SHAPERS = {"choice": _choice, "noul": _noul, "score": _score}

# JevAny's answer keys, in its order (its api.py to_answers). What it reports over HTTP and
# what its usage.output_tokens counts; noul's probabilities are our addition.
JEVANY_KEYS = {"choice": ("type", "choice", "confidence", "probabilities"),
               "noul": ("type", "noul"),
               "score": ("type", "score", "legend", "probabilities", "confidence")}


def jevany_answers(answers: dict[str, dict]) -> dict[str, dict]:
    """The answers as JevAny writes them: its keys, in its order, none of ours. The input is left as it is."""
    return {qid: {key: answer[key] for key in JEVANY_KEYS[answer["type"]]} for qid, answer in answers.items()}


def _fail(q: Question, problem: str) -> InternalError:
    return InternalError(f"answer for question {q.qid!r} failed its self-check: {problem}")


def _unit(q: Question, value: Any, name: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= 1:
        raise _fail(q, f"{name} must be a finite number in [0, 1], got {value!r}")
    return float(value)


def _distribution(q: Question, probabilities: Any) -> list[float]:
    keys = q.keys
    if not isinstance(probabilities, dict) or set(probabilities) != set(keys):
        raise _fail(q, "probability keys do not match the options")
    values = [_unit(q, probabilities[key], f"probability of {key!r}") for key in keys]
    total = sum(values)
    tolerance = max(1e-5, 0.005 * len(keys) + 1e-8)
    if total <= 0 or abs(total - 1) > tolerance:
        raise _fail(q, f"probabilities sum to {total}")
    return values


def validate_answer(q: Question, answer: Any) -> None:
    if not isinstance(answer, dict) or answer.get("type") != q.type:
        raise _fail(q, f"answer must be a map of type {q.type!r}")
    values = _distribution(q, answer.get("probabilities"))
    if q.type == "noul":
        _unit(q, answer.get("noul"), "noul")
        return
    _unit(q, answer.get("confidence"), "confidence")
    if q.type == "choice":
        _check_choice(q, answer.get("choice"), values)
    else:
        _check_score(q, answer)


def _check_choice(q: Question, choice: Any, values: list[float]) -> None:
    if not isinstance(choice, str) or choice not in q.criteria:
        raise _fail(q, f"unknown choice {choice!r}")
    if values[q.keys.index(choice)] < max(values):
        raise _fail(q, f"choice {choice!r} is not an argmax")


def _check_score(q: Question, answer: dict) -> None:
    score = answer.get("score")
    top = q.n_options - 1
    if type(score) not in (int, float) or not math.isfinite(score) or not 0 <= score <= top:
        raise _fail(q, f"score must be a number in [0, {top}], got {score!r}")
    legend = answer.get("legend")
    if not isinstance(legend, dict) or set(legend) != set(q.keys):
        raise _fail(q, "legend must cover every level")
