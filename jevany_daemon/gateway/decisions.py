"""OpenAI's Decisions API (POST /v1/decisions, a preview): its body, as a decide request and back.

Served beside /v1/systemone from the same queue and batches: a decisions
request becomes the decide request a Jev API caller would send for the same
questions, so both get the same probabilities. The shapes follow the public
ports of the preview (NVIDIA Dynamo's, gproxy's and vLLM-Omni's, which agree);
docs/JEV-API.md says what is followed and what may still move.

    request   {model, input, questions: [...], safety_identifier?}
              input: text, or user messages of input_text parts (input_image: refused, typed)
              predicate {name?, instructions}                     → noul
              choice    {name?, instructions, choices: [{value, description?}]}  → choice
              score     {name?, instructions, levels: [{label, description?}]}   → score
    response  {model, answers: [...] in question order, usage}

A question's id in the decide request is its position ("0", "1" ...), so
names may repeat or be left out, as the preview allows. Errors carry
OpenAI's envelope, {"error": {message, type, param, code}} (dialects.py).
"""
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, StrictBool, StrictStr, model_validator

MAX_QUESTIONS = 64          # the daemon's own cap (protocol.py), as /v1/systemone
MAX_CHOICES = 255
MAX_LEVELS = 10


class InputText(BaseModel):
    type: Literal["input_text"]
    text: str


class InputImage(BaseModel):
    type: Literal["input_image"]
    image_url: str = ""
    detail: str | None = None


Part = Annotated[Union[InputText, InputImage], Field(discriminator="type")]


class Message(BaseModel):
    role: Literal["user"]
    type: Literal["message"] | None = None
    content: str | list[Part]


class Predicate(BaseModel):
    type: Literal["predicate"]
    name: str | None = None
    instructions: str


class ChoiceValue(BaseModel):
    value: StrictStr | StrictBool        # 0 and 1 are neither: not taken for false and true
    description: str | None = None


class Choice(BaseModel):
    type: Literal["choice"]
    name: str | None = None
    instructions: str
    choices: list[ChoiceValue] = Field(min_length=2, max_length=MAX_CHOICES)

    @model_validator(mode="after")
    def _distinct(self):
        keys = [_key(c.value) for c in self.choices]
        if len(set(keys)) != len(keys):
            raise ValueError("choice values must be distinct")
        return self


class Level(BaseModel):
    label: str
    description: str | None = None


class Score(BaseModel):
    type: Literal["score"]
    name: str | None = None
    instructions: str
    levels: list[Level] = Field(min_length=2, max_length=MAX_LEVELS)


Question = Annotated[Union[Predicate, Choice, Score], Field(discriminator="type")]


class DecisionsRequest(BaseModel):
    """OpenAI's Decisions API request: an input and an ordered list of typed questions."""
    model: str = Field(min_length=1)
    input: str | list[Message]
    questions: list[Question] = Field(min_length=1, max_length=MAX_QUESTIONS)
    safety_identifier: str | None = Field(default=None, max_length=128)     # accepted, not used

    def images(self) -> bool:
        return isinstance(self.input, list) and any(
            isinstance(m.content, list) and any(p.type == "input_image" for p in m.content) for m in self.input)

    def to_body(self) -> dict:
        """The decide request a Jev API caller sends for the same questions (protocol v1)."""
        return {"model": self.model, "state": self._state(),
                "questions": {str(i): _question(q) for i, q in enumerate(self.questions)}}

    def _state(self) -> str:
        if isinstance(self.input, str):
            return self.input
        texts = []
        for message in self.input:
            parts = [message.content] if isinstance(message.content, str) else [p.text for p in message.content]
            texts.extend(parts)
        return "\n\n".join(texts)

    def answers(self, answers: dict[str, dict], shown: dict[str, dict]) -> list[dict]:
        """The decide result's answers (the protocol's, keyed by position) as the Decisions API's: the
        probabilities unrounded, each score their expectation, confidences as the dialect shows them."""
        return [_answer(q, answers[str(i)], shown[str(i)]) for i, q in enumerate(self.questions)]


def _key(value: str | bool) -> str:
    """A choice value as a Jev option name: booleans as JSON writes them."""
    return ("true" if value else "false") if isinstance(value, bool) else value


def _level(level: Level) -> str:
    return level.label if level.description is None else f"{level.label}: {level.description}"


def _question(q) -> dict:
    if q.type == "predicate":
        return {"type": "noul", "instructions": q.instructions}
    if q.type == "choice":
        return {"type": "choice", "instructions": q.instructions,
                "criteria": {_key(c.value): c.description for c in q.choices}}
    return {"type": "score", "instructions": q.instructions, "criteria": [_level(level) for level in q.levels]}


def _answer(q, answer: dict, shown: dict) -> dict:
    p = answer["probabilities"]
    if q.type == "predicate":
        return {"type": "predicate", "name": q.name, "probability": p["true"]}
    if q.type == "choice":
        by_key = {_key(c.value): c.value for c in q.choices}
        return {"type": "choice", "name": q.name, "choice": by_key[answer["choice"]],
                "confidence": shown["confidence"],
                "probabilities": [{"value": c.value, "probability": p[_key(c.value)]} for c in q.choices]}
    levels = [p[str(i)] for i in range(len(q.levels))]
    return {"type": "score", "name": q.name, "score": sum(i * pi for i, pi in enumerate(levels)),
            "confidence": shown["confidence"],
            "probabilities": [{"value": i, "label": level.label, "probability": pi}
                              for i, (level, pi) in enumerate(zip(q.levels, levels))]}


def usage(result: dict) -> dict:
    """The decide result's usage in the Decisions API's fields; what the daemon does not count is 0."""
    counted = result["usage"]
    return {"input_tokens": counted["input_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": counted["output_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counted["input_tokens"] + counted["output_tokens"]}
