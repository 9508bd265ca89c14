"""Small builders so callers write Choice([...]) instead of wire maps."""

import os
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


@dataclass(frozen=True)
class Image:
    """An image the daemon reads from its media root: a path inside it, or relative to it."""
    uri: str | os.PathLike

    def to_wire(self) -> dict[str, str]:
        return {"type": "image", "uri": os.fspath(self.uri)}


@dataclass(frozen=True)
class Video:
    """A video the daemon reads from its media root: a path inside it, or relative to it."""
    uri: str | os.PathLike

    def to_wire(self) -> dict[str, str]:
        return {"type": "video", "uri": os.fspath(self.uri)}


IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff"})
VIDEO_SUFFIXES = frozenset({".mp4", ".mkv", ".webm", ".mov", ".avi", ".m4v", ".mpg", ".mpeg"})


def media_from_path(path: str) -> "Image | Video":
    """image:PATH or video:PATH, or a PATH whose suffix says which; ValueError when none does."""
    kind, sep, rest = path.partition(":")
    if sep and kind in ("image", "video") and rest:
        return (Image if kind == "image" else Video)(rest)
    suffix = os.path.splitext(path)[1].lower()
    if suffix in IMAGE_SUFFIXES:
        return Image(path)
    if suffix in VIDEO_SUFFIXES:
        return Video(path)
    raise ValueError(f"cannot tell whether {path!r} is an image or a video; write image:{path} or video:{path}")


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
