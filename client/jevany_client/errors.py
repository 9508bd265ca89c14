"""Typed errors that cross the wire as protocol codes and come back as the same classes."""

from typing import Any


class JevanyError(Exception):
    code: str = "internal"
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        request_id: str | int | None = None,
        code: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        # Overrides exist only so a code this client does not know yet keeps
        # its name and retry advice; the subclasses never pass them.
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}

    def __reduce__(self):
        # Workers hand errors to the daemon through pickle; keep the id and overrides.
        return (type(self), (self.message,), dict(self.__dict__))


class InvalidMessageError(JevanyError):
    code = "invalid_message"


class UnsupportedVersionError(JevanyError):
    code = "unsupported_version"


class UnknownOpError(JevanyError):
    code = "unknown_op"


class ForbiddenError(JevanyError):
    code = "forbidden"


class InvalidRequestError(JevanyError):
    code = "invalid_request"


class UnknownModelError(JevanyError):
    code = "unknown_model"


class ContextLengthError(JevanyError):
    code = "context_length_exceeded"


class UnsupportedMediaError(JevanyError):
    code = "unsupported_media"


class OverloadedError(JevanyError):
    code = "overloaded"
    retryable = True


class DeadlineExceededError(JevanyError):
    code = "deadline_exceeded"
    retryable = True


class ShuttingDownError(JevanyError):
    code = "shutting_down"
    retryable = True


class WorkerLostError(JevanyError):
    code = "worker_lost"
    retryable = True


class InternalError(JevanyError):
    code = "internal"


class JevTimeoutError(JevanyError, TimeoutError):
    """No reply came within the client's own timeout; the client stays usable.

    Raised by the client, never sent by a daemon: "timeout" is not a protocol
    code, so it is absent from ERROR_CLASSES. It is a JevanyError so one except
    clause and one `retryable` check cover every failed call, and a builtin
    TimeoutError so code that knows nothing of jevany still recognises it.
    `sent` is False when the request never left the client because no daemon
    accepted the connection in time (nothing was scored).
    """

    code = "timeout"
    retryable = True

    def __init__(
        self, message: str, *, request_id: str | int | None = None, sent: bool = True
    ) -> None:
        super().__init__(message, request_id=request_id)
        self.sent = sent


class JevUnreachableError(JevTimeoutError):
    """No daemon can be there at all: every endpoint is an ipc socket file that does not exist, or one
    is a socket another local user could have put there (ipc_trust.py), to which nothing is sent.

    Raised at once instead of after the timeout; `sent` is False. A
    JevTimeoutError still, so code that handles "not reachable" handles this.
    """

    def __init__(self, message: str, *, request_id: str | int | None = None) -> None:
        super().__init__(message, request_id=request_id, sent=False)


ERROR_CLASSES: dict[str, type[JevanyError]] = {
    cls.code: cls
    for cls in (
        InvalidMessageError,
        UnsupportedVersionError,
        UnknownOpError,
        ForbiddenError,
        InvalidRequestError,
        UnknownModelError,
        ContextLengthError,
        UnsupportedMediaError,
        OverloadedError,
        DeadlineExceededError,
        ShuttingDownError,
        WorkerLostError,
        InternalError,
    )
}


def error_from_wire(d: dict[str, Any], request_id: str | int | None = None) -> JevanyError:
    if not isinstance(d, dict) or not isinstance(d.get("code"), str):
        raise InvalidMessageError(f"malformed error object: {d!r:.200}", request_id=request_id)
    code = d["code"]
    message = d.get("message")
    message = message if isinstance(message, str) else ""
    cls = ERROR_CLASSES.get(code)
    if cls is not None:
        # The protocol table, not the sender, decides whether a known code is retryable.
        return cls(message, request_id=request_id)
    return JevanyError(
        message, request_id=request_id, code=code, retryable=d.get("retryable") is True
    )
