"""Decide bodies as the wire carries them, from typed questions and media or from maps."""

from collections.abc import Iterable, Mapping
from typing import Any

from .questions import Choice, Image, Noul, Score, Video, questions_to_wire
from .schema import Media


def decide_body(
    state: Any,
    questions: Mapping[str, Choice | Noul | Score | dict],
    model: str | None = None,
    media: Iterable[Media | Image | Video | dict] | None = None,
) -> dict[str, Any]:
    """The wire body of a `decide` request (decide_many takes these, or the same with typed questions)."""
    body: dict[str, Any] = {"state": state, "questions": questions_to_wire(questions)}
    if model is not None:
        body["model"] = model
    if media is not None:
        body["media"] = [media_to_wire(item) for item in media]
    return body


def as_wire_body(body: Any) -> Any:
    """A decide body whose questions (and media) may be typed, as the wire carries it.

    What is not a body map at all is left for the daemon to refuse, in place.
    The caller's map is never changed.
    """
    if not isinstance(body, Mapping):
        return body
    wire = dict(body)
    questions = wire.get("questions")
    if isinstance(questions, Mapping) and all(isinstance(q, (Choice, Noul, Score, Mapping))
                                              for q in questions.values()):
        wire["questions"] = questions_to_wire(questions)
    media = wire.get("media")
    if isinstance(media, (list, tuple)) and all(isinstance(m, (Media, Image, Video, Mapping)) for m in media):
        wire["media"] = [media_to_wire(item) for item in media]
    return wire


def media_to_wire(item: Media | Image | Video | dict) -> dict:
    if isinstance(item, Media):
        return {"type": item.type, "uri": item.uri}
    if isinstance(item, (Image, Video)):
        return item.to_wire()
    return dict(item)
