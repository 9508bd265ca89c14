"""The `decide` body: JevAny's field rules, checked without recursion."""

from dataclasses import dataclass
from typing import Any

from ._values import find_problem, shorten
from .errors import InvalidRequestError
from .protocol import MAX_DEPTH

QUESTION_TYPES = ("choice", "noul", "score")
MEDIA_TYPES = ("image", "video")
MAX_QUESTIONS = 64
MAX_CRITERIA = 4096
MAX_MEDIA = 32

_BODY_KEYS = frozenset(("model", "state", "questions", "media"))
_QUESTION_KEYS = frozenset(("type", "instructions", "criteria"))
_MEDIA_KEYS = frozenset(("type", "uri"))
_NOUL_KEYS = frozenset(("false", "true"))


@dataclass(frozen=True)
class Question:
    qid: str
    type: str
    instructions: Any
    criteria: Any

    @property
    def keys(self) -> tuple[str, ...]:
        if self.type == "choice":
            return tuple(self.criteria)
        if self.type == "noul":
            return ("false", "true")
        return tuple(str(i) for i in range(len(self.criteria)))

    @property
    def n_options(self) -> int:
        return 2 if self.type == "noul" else len(self.criteria)


@dataclass(frozen=True)
class Media:
    type: str
    uri: str


@dataclass(frozen=True)
class DecisionRequest:
    state: Any
    questions: tuple[Question, ...]
    model: str | None = None
    media: tuple[Media, ...] = ()


def _bad(where: str, problem: str) -> InvalidRequestError:
    return InvalidRequestError(f"{where}: {problem}")


def check_value(value: Any, where: str, *, outer_depth: int = 0) -> None:
    """Refuse anything JSON cannot carry, and nesting past MAX_DEPTH levels.

    `outer_depth` is how many containers already enclose `value`; the protocol
    counts depth from the body map, which is level 1.
    """
    found = find_problem(value, where, outer_depth=outer_depth, max_depth=MAX_DEPTH)
    if found is not None:
        raise _bad(*found)


def _key_list(keys: Any) -> list[str]:
    # JevAny's wording lists keys sorted; long lists and names are cut short.
    return [shorten(k) for k in sorted(keys)[:10]]


def _reject_unknown(value: dict, allowed: frozenset, where: str) -> None:
    unknown = set(value) - allowed
    if unknown:
        # JevAny's wording first (callers match on it), then what would have been accepted.
        hint = " (a question's options go in criteria: see docs/REQUESTS.md)" if "options" in unknown else ""
        raise _bad(where, f"unknown keys: {_key_list(unknown)}; allowed: {sorted(allowed)}{hint}")


def parse_decision(body: Any) -> DecisionRequest:
    if not isinstance(body, dict):
        raise _bad("body", "must be a map")
    # One walk over everything first: later checks may then assume str keys,
    # JSON-only values and bounded depth.
    check_value(body, "")
    _reject_unknown(body, _BODY_KEYS, "body")
    if "state" not in body:
        raise _bad("state", "is required")
    return DecisionRequest(
        state=body["state"],
        questions=_questions(body),
        model=_model(body),
        media=_media(body),
    )


def _model(body: dict) -> str | None:
    if "model" not in body:
        return None
    model = body["model"]
    if not isinstance(model, str) or not model:
        raise _bad("model", "must be a non-empty string")
    return model


def _questions(body: dict) -> tuple[Question, ...]:
    if "questions" not in body:
        raise _bad("questions", "is required")
    questions = body["questions"]
    if not isinstance(questions, dict):
        raise _bad("questions", "must be a map of question id to question")
    if not 1 <= len(questions) <= MAX_QUESTIONS:
        raise _bad("questions", f"must hold 1 to {MAX_QUESTIONS} questions, got {len(questions)}")
    # An empty id or option name is one like any other, as in JevAny.
    return tuple(_question(qid, q) for qid, q in questions.items())


def _question(qid: str, question: Any) -> Question:
    where = f"questions.{shorten(qid)}"
    if not isinstance(question, dict):
        raise _bad(where, "must be a map")
    _reject_unknown(question, _QUESTION_KEYS, where)
    qtype = question.get("type")
    if qtype is None:
        raise _bad(f"{where}.type", "is required")
    if qtype not in QUESTION_TYPES:
        got = shorten(qtype) if isinstance(qtype, str) else qtype
        raise _bad(f"{where}.type", f"must be one of {', '.join(QUESTION_TYPES)}; got {got!r}")
    criteria = _CRITERIA[qtype](question.get("criteria"), f"{where}.criteria")
    return Question(qid, qtype, question.get("instructions"), criteria)


def choice_shape(criteria: Any) -> str:
    """What a choice's criteria must be, shown with the options a list held (Python's Choice takes a list;
    the wire keeps one shape, the map, so that an option's description has a place)."""
    names = [c for c in criteria if isinstance(c, str)][:3] if isinstance(criteria, (list, tuple)) else []
    example = ", ".join(f'"{n}": null' for n in names) if names else '"refund": null, "resend": "ship it again"'
    return (f"must be a map of option name to description (null for none), e.g. {{{example}}}"
            + ("; a list holds a score's levels" if isinstance(criteria, (list, tuple)) else ""))


def _choice_criteria(criteria: Any, where: str) -> dict:
    if criteria is None:
        raise _bad(where, "is required for a choice question")
    if not isinstance(criteria, dict):
        raise _bad(where, choice_shape(criteria))
    if not 1 <= len(criteria) <= MAX_CRITERIA:
        raise _bad(where, f"must hold 1 to {MAX_CRITERIA} options, got {len(criteria)}")
    return criteria


def _score_criteria(criteria: Any, where: str) -> list | tuple:
    if criteria is None:
        raise _bad(where, "is required for a score question")
    if not isinstance(criteria, (list, tuple)):
        raise _bad(where, "must be an array of levels, lowest first")
    if not 2 <= len(criteria) <= MAX_CRITERIA:
        raise _bad(where, f"must hold 2 to {MAX_CRITERIA} levels, got {len(criteria)}")
    return criteria


def _noul_criteria(criteria: Any, where: str) -> dict | None:
    if criteria is None:
        return None
    if not isinstance(criteria, dict):
        raise _bad(where, "must be a map with the keys false and/or true")
    unknown = set(criteria) - _NOUL_KEYS
    if unknown:
        raise _bad(
            where, f"noul criteria only accepts false and true; unknown keys: {_key_list(unknown)}"
        )
    return criteria


_CRITERIA = {"choice": _choice_criteria, "noul": _noul_criteria, "score": _score_criteria}


def parse_media(body: dict) -> tuple[Media, ...]:
    """A body's media alone, checked as parse_decision checks them (the rest of the body unread)."""
    if isinstance(body.get("media"), (list, tuple)) and len(body["media"]) <= MAX_MEDIA:
        check_value(body["media"], "media", outer_depth=1)
    return _media(body)


def _media(body: dict) -> tuple[Media, ...]:
    if "media" not in body:
        return ()
    media = body["media"]
    if not isinstance(media, (list, tuple)):
        raise _bad("media", "must be an array")
    if len(media) > MAX_MEDIA:
        raise _bad("media", f"must hold at most {MAX_MEDIA} items, got {len(media)}")
    return tuple(_media_item(item, f"media[{i}]") for i, item in enumerate(media))


def _media_item(item: Any, where: str) -> Media:
    if not isinstance(item, dict):
        raise _bad(where, "must be a map {type, uri}")
    _reject_unknown(item, _MEDIA_KEYS, where)
    if item.get("type") not in MEDIA_TYPES:
        raise _bad(f"{where}.type", f"must be one of {', '.join(MEDIA_TYPES)}")
    uri = item.get("uri")
    if not isinstance(uri, str) or not uri:
        raise _bad(f"{where}.uri", "must be a non-empty string")
    return Media(item["type"], uri)
