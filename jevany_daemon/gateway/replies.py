"""How the daemon's typed errors look over HTTP: JevAny's status codes and header, our codes in another.

JevAny answers a bad or too-long request with 422 and `{"detail": message}`,
adding `X-JevAny-Error-Code: context_length_exceeded` for the latter only (its
remote evaluation tells an over-long request from others by it, and its tests
check it is absent on any other 422), and an unloaded model with 503. The
states JevAny never had get the codes HTTP clients already know how to retry.
Every error carries its protocol code in X-Jevany-Daemon-Error, so a caller can
tell them apart without parsing text.
"""
from fastapi.responses import JSONResponse

from jevany_client.errors import JevanyError

from .dialects import error_body, error_status

ERROR_CODE_HEADER = "X-Jevany-Daemon-Error"
JEVANY_ERROR_HEADER = "X-JevAny-Error-Code"
JEVANY_CODES = {"context_length_exceeded"}     # the only code JevAny's header carries
TIMEOUT_HEADER = "X-JevAny-Timeout-Ms"
RETRY_AFTER_S = "1"

STATUS = {
    "invalid_request": 422,
    "unknown_model": 422,
    "context_length_exceeded": 422,
    "unsupported_media": 422,
    "invalid_message": 400,
    "unsupported_version": 400,
    "unknown_op": 400,
    "forbidden": 403,
    "overloaded": 429,          # with Retry-After
    "shutting_down": 503,
    "worker_lost": 503,         # with Retry-After: a replacement worker is starting
    "deadline_exceeded": 504,
    "timeout": 504,             # the gateway gave up waiting on the daemon
    "internal": 500,
    "not_ready": 503,           # the gateway's own: the model has not loaded yet
    "not_found": 404,           # the gateway's own: no such route, or metrics off
}
RETRY_AFTER = {"overloaded", "worker_lost", "shutting_down", "not_ready"}


def error_response(code: str, message: str, dialect: str = "jevany", status: int | None = None,
                   loc: list | None = None) -> JSONResponse:
    """An error as the dialect writes its body (dialects.py), with our headers; status: STATUS's by default;
    loc: where in the body the problem is."""
    status = status or error_status(dialect, code, STATUS.get(code, 500))
    headers = {ERROR_CODE_HEADER: code}
    if code in JEVANY_CODES:
        headers[JEVANY_ERROR_HEADER] = code
    if code in RETRY_AFTER:
        headers["Retry-After"] = RETRY_AFTER_S
    return JSONResponse(error_body(dialect, status, code, message, loc), status_code=status, headers=headers)


def from_error(exc: JevanyError, dialect: str = "jevany") -> JSONResponse:
    return error_response(exc.code, exc.message, dialect)
