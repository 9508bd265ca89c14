"""Small builders so callers write Choice([...]) instead of wire maps."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Choice:
    criteria: Mapping[str, Any] | Iterable[str]
    instructions: Any = None

    def __post_init__(self) -> None:
        _refuse_str(self.criteria, "criteria")
        if isinstance(self.criteria, Mapping):
            criteria = dict(self.criteria)
        else:
            names = list(self.criteria)
            criteria = dict.fromkeys(names)
            if len(criteria) != len(names):
                # A dict would silently fold the duplicates into one option.
                raise ValueError(f"choice names repeat: {names!r}")
        object.__setattr__(self, "criteria", criteria)

    def to_wire(self) -> dict[str, Any]:
        return _wire("choice", self.instructions, dict(self.criteria))


@dataclass(frozen=True)
class Noul:
    instructions: Any = None
    criteria: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        criteria = None if self.criteria is None else dict(self.criteria)
        return _wire("noul", self.instructions, criteria)


@dataclass(frozen=True)
class Score:
    levels: Iterable[Any]
    instructions: Any = None

    def __post_init__(self) -> None:
        _refuse_str(self.levels, "levels")
        object.__setattr__(self, "levels", tuple(self.levels))

    def to_wire(self) -> dict[str, Any]:
        return _wire("score", self.instructions, list(self.levels))


def _refuse_str(value: Any, name: str) -> None:
    # A str is iterable, and would otherwise become one option per character.
    if isinstance(value, str):
        raise TypeError(f"{name} must be a collection, not the str {value!r}")


def _wire(qtype: str, instructions: Any, criteria: Any) -> dict[str, Any]:
    # Absent and null mean the same to the daemon; absent keeps messages small.
    wire: dict[str, Any] = {"type": qtype}
    if instructions is not None:
        wire["instructions"] = instructions
    if criteria is not None:
        wire["criteria"] = criteria
    return wire


def questions_to_wire(questions: Mapping[str, Choice | Noul | Score | dict]) -> dict:
    wire = {}
    for qid, question in questions.items():
        if isinstance(question, (Choice, Noul, Score)):
            wire[qid] = question.to_wire()
        elif isinstance(question, Mapping):
            wire[qid] = dict(question)
        else:
            raise TypeError(f"question {qid!r} is a {type(question).__name__}, not a question")
    return wire
