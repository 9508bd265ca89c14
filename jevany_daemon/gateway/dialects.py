"""Where JevAny's HTTP API and TypeSafe's Jev API differ, the choice each dialect makes (--http-dialect).

Both serve POST /v1/systemone with the same request and the same answers,
and the field's clients (typesafe-sdk, jevcompat) and JevAny's tools both
read every response. Where the two contracts disagree, JevAny's users'
metrics and tools depend on its choices, so they are the default
(`jevany`); `typesafe` follows TypeSafe's reference (as jevcompat reads it):

- extra response fields: JevAny's `latency_ms` beside model, answers and
  usage; typesafe, `x_latency_ms` (and our additions, when asked for with
  X-Jevany-Daemon-Additions, each prefixed `x_`);
- a score level that is a number or a boolean: JevAny's legend shows it as
  sent; typesafe, as the text the model read ("3"), since the SDK takes
  only text, objects and arrays there (a null level is "" in both);
- a score's confidence: JevAny's 1 - sum p_i |i - mode| / (n - 1); typesafe
  divides by the spread of the uniform distribution instead,
  sum |i - (n-1)/2| / n, and clips at 0 (a choice's confidence is the same
  in both);
- error bodies: JevAny's `{"detail": "message"}`; typesafe, a validation
  failure (422) as FastAPI's `{"detail": [{"loc", "msg", "type"}]}` and any
  other error as `{"detail": {"error_type", "message"}}`, with the field's
  error types (authentication_error, rate_limit_error ...);
- an unknown model: JevAny's 422; typesafe, 400 with api_usage_error, as
  TypeSafe's reference answers it.

A missing or wrong token is refused in the field's shape in both dialects:
JevAny serves no token, so there is no JevAny refusal to keep.

Everything else (status codes, headers, the answers' keys and order) is the
same in both. docs/JEV-API.md lists both contracts side by side.
"""
from typing import Any

from jevany_client.answers import jevany_answers
from jevany_client.render import render

from jevany_daemon.http_options import DIALECTS


OPENAI = "openai"       # not a dialect to choose: the error bodies of /v1/decisions, OpenAI's API
JEVANY_BODY = ("model", "answers", "usage", "latency_ms")

# The field's error types (TypeSafe's API, as typesafe-sdk and jevcompat read them), by our protocol code.
ERROR_TYPES = {
    "unauthorized": "authentication_error",
    "forbidden": "permission_error",
    "overloaded": "rate_limit_error",
    "shutting_down": "overloaded_error",
    "worker_lost": "overloaded_error",
    "not_ready": "overloaded_error",
    "deadline_exceeded": "timeout_error",
    "timeout": "timeout_error",
    "invalid_message": "invalid_request_error",
    "unsupported_version": "invalid_request_error",
    "unknown_op": "invalid_request_error",
    "not_found": "not_found",
    "unknown_model": "api_usage_error",
    "internal": "internal_error",
}
FIELD_SHAPED = {"unauthorized"}     # codes JevAny never answers: the field's body in both dialects
# Where the typesafe dialect answers a code with another status than JevAny's (replies.STATUS).
TYPESAFE_STATUS = {"unknown_model": 400}
# What each code's validation failure points at, in the body (a typesafe 422's loc).
LOCATIONS = {"unknown_model": ["body", "model"], "unsupported_media": ["body", "assets"]}


def answer_body(result: dict, dialect: str, additions: bool) -> dict:
    """A decide result as the dialect's response body; with additions, the protocol's result whole."""
    if dialect == "typesafe":
        body = {"model": result["model"], "answers": _typesafe_answers(result["answers"]), "usage": result["usage"],
                "x_latency_ms": result["latency_ms"]}
        if additions:
            body |= {f"x_{key}": value for key, value in result.items() if key not in body and key != "answers"}
            body["x_answers"] = result["answers"]
        return body
    if additions:
        return result
    body = {key: result[key] for key in JEVANY_BODY}
    body["answers"] = jevany_answers(result["answers"])
    return body


def _typesafe_answers(answers: dict[str, dict]) -> dict[str, dict]:
    out = jevany_answers(answers)
    for answer in out.values():
        if answer["type"] == "score":
            answer["confidence"] = round(score_confidence(list(answer["probabilities"].values())), 2)
            # A legend value is text, an object or an array to the SDK: a number level as the text the model read.
            answer["legend"] = {k: v if isinstance(v, (str, dict, list)) else render(v)
                                for k, v in answer["legend"].items()}
    return out


def score_confidence(p: list[float]) -> float:
    """TypeSafe's reference: 1 - sum p_i |i - mode| over the uniform distribution's mean distance from the
    middle, at least 0."""
    n = len(p)
    if n <= 1:
        return 1.0
    mode = max(range(n), key=p.__getitem__)
    spread = sum(pi * abs(i - mode) for i, pi in enumerate(p))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return max(0.0, 1.0 - spread / uniform)


# OpenAI's error types by HTTP status (its envelope's `type`), and its codes where it has one for ours.
OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                429: "rate_limit_exceeded"}
OPENAI_CODES = {"unknown_model": "model_not_found"}
# pydantic's tags of a union's members, in a location: not where in the body a caller looks.
_UNION_TAGS = {"predicate", "choice", "score", "input_text", "input_image", "str"}


def error_status(dialect: str, code: str, jevany_status: int) -> int:
    """The status an error gets: JevAny's, but where the typesafe dialect differs; on /v1/decisions
    (OPENAI), a refused body is a 400, as OpenAI's API answers it."""
    if dialect == OPENAI:
        return 404 if code == "unknown_model" else 400 if jevany_status == 422 else jevany_status
    return TYPESAFE_STATUS.get(code, jevany_status) if dialect == "typesafe" else jevany_status


def error_body(dialect: str, status: int, code: str, message: str, loc: list | None = None) -> dict[str, Any]:
    """An error's body: JevAny's {"detail": message}; typesafe's by kind (see the module's docstring);
    loc: where in the body a validation failure is (typesafe's 422s), LOCATIONS's by default."""
    if dialect == OPENAI:
        return _openai_error(status, code, message, loc)
    if dialect != "typesafe" and code not in FIELD_SHAPED:
        return {"detail": message}
    if status == 422:
        return {"detail": [{"loc": loc or LOCATIONS.get(code, ["body"]), "msg": message, "type": code}]}
    kind = "request_too_large" if status == 413 else ERROR_TYPES.get(code, "invalid_request_error")
    return {"detail": {"error_type": kind, "message": message}}


def _openai_error(status: int, code: str, message: str, loc: list | None) -> dict[str, Any]:
    """OpenAI's error envelope; param: where in the body (questions.0.choices), code: OpenAI's or ours."""
    kind = OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    where = [str(part) for part in (loc or [])[1:] if str(part) not in _UNION_TAGS and "[" not in str(part)]
    return {"error": {"message": message, "type": kind, "param": ".".join(where) or None,
                      "code": OPENAI_CODES.get(code, code)}}
