"""JevAny's POST /v1/systemone body, as pydantic models.

The same rules JevAny's server applies, written here so that an HTTP caller
gets the 422s it got from JevAny (FastAPI's validation `detail` list) and
/openapi.json describes the body. Unknown fields are ignored, as pydantic
does by default and JevAny keeps: a JevAny client that sends extra fields
keeps working. What passes here is rebuilt as a strict protocol-v1 body
(`to_body`), and the daemon's own checks (token limits, option caps) still
apply; their failures come back as 422s with a string `detail`, like
JevAny's ValueErrors.
"""
import math
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, Field, field_validator, model_validator

from jevany_client.schema import choice_shape

MAX_OPTIONS = 4096
MAX_QUESTIONS = 64
MAX_MEDIA = 32
ASSETS_HERE = ("images as assets are served on POST /v1/systemone, sent as multipart/form-data (the JSON in a "
               "part named request, each image in the part its asset names)")


def _finite(value: Any) -> Any:
    # JSON has no NaN or Infinity, but Python's parser accepts them; they would
    # reach the model's prompt as text and break the promise of finite values.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("JSON numbers must be finite")
    if isinstance(value, dict):
        for item in value.values():
            _finite(item)
    elif isinstance(value, list):
        for item in value:
            _finite(item)
    return value


Content = Annotated[Union[str, dict, list, int, float, bool, None], AfterValidator(_finite)]


class Noul(BaseModel):
    """A yes/no question; criteria may describe "false" and "true"."""
    type: Literal["noul"] = "noul"
    instructions: Content = None
    criteria: dict[str, Content] | None = None

    @model_validator(mode="after")
    def _only_false_and_true(self):
        unknown = sorted(set(self.criteria or {}) - {"false", "true"})
        if unknown:
            raise ValueError(f"noul criteria only accepts false and true; unknown keys: {unknown}")
        return self


class Choice(BaseModel):
    """One of named options; criteria maps each option to its description (or null)."""
    type: Literal["choice"] = "choice"
    instructions: Content = None
    criteria: dict[str, Content]

    @field_validator("criteria", mode="before")
    @classmethod
    def _a_map(cls, criteria):
        if not isinstance(criteria, dict):      # pydantic would say only "Input should be a valid dictionary"
            raise ValueError(f"a choice's criteria {choice_shape(criteria)}")
        return criteria

    @model_validator(mode="after")
    def _option_count(self):
        if not 1 <= len(self.criteria) <= MAX_OPTIONS:
            raise ValueError(f"criteria must have 1..{MAX_OPTIONS} options")
        return self


class Score(BaseModel):
    """A level on an ordered scale; criteria lists the levels, lowest first."""
    type: Literal["score"] = "score"
    instructions: Content = None
    criteria: list[Content] = Field(min_length=2, max_length=MAX_OPTIONS)


class Box(BaseModel):
    """The Jev API's box question (typesafe-sdk 0.7.5): where something is in an image. Parsed so that
    it is refused by name (SystemOneRequest.unsupported), not as an unknown type."""
    type: Literal["box"] = "box"
    instructions: Content = None


Question = Annotated[Union[Noul, Choice, Score, Box], Field(discriminator="type")]


class Media(BaseModel):
    type: Literal["image", "video"]
    uri: str = Field(min_length=1)


class SystemOneRequest(BaseModel):
    """A state and typed questions about it, answered in one prefill pass."""
    state: Content
    model: str = Field(default="jevany-latest", min_length=1)
    media: list[Media] = Field(default_factory=list, max_length=MAX_MEDIA)
    questions: dict[str, Question] = Field(min_length=1, max_length=MAX_QUESTIONS)
    # The Jev API's images, each naming a part of a multipart body (gateway/assets.py); never dropped.
    assets: dict[str, Any] | None = None

    def unsupported(self) -> tuple[str, list, str] | None:
        """What a valid request asks that this daemon does not serve: (code, where, why), or None."""
        for qid, q in self.questions.items():
            if q.type == "box":
                return ("invalid_request", ["body", "questions", qid, "type"],
                        f"question {qid!r} is a box question (where something is in an image); a decision "
                        "model answers noul, choice and score questions only")
        return None

    def to_body(self, uploaded: list[str] | None = None) -> dict:
        """The strict protocol-v1 decide body: only the fields the daemon knows; uploaded: the paths the
        assets' images were written to (gateway/assets.py), after JevAny's media entries."""
        if (unsupported := self.unsupported()) is not None:
            raise ValueError(unsupported[2])
        if self.assets and uploaded is None:
            raise ValueError(ASSETS_HERE)
        questions = {}
        for qid, q in self.questions.items():
            question = {"type": q.type, "instructions": q.instructions}
            if q.criteria is not None:
                question["criteria"] = q.criteria
            questions[qid] = question
        body = {"state": self.state, "questions": questions, "model": self.model}
        media = [{"type": m.type, "uri": m.uri} for m in self.media]
        media += [{"type": "image", "uri": path} for path in uploaded or ()]
        if media:
            body["media"] = media
        return body
