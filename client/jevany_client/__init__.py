"""jevany-client: the wire protocol, request schema and client for jevany-daemon. No torch."""

from .errors import (
    ERROR_CLASSES,
    ContextLengthError,
    DeadlineExceededError,
    ForbiddenError,
    InternalError,
    InvalidMessageError,
    InvalidRequestError,
    JevanyError,
    JevTimeoutError,
    JevUnreachableError,
    OverloadedError,
    ShuttingDownError,
    UnknownModelError,
    UnknownOpError,
    UnsupportedMediaError,
    UnsupportedVersionError,
    WorkerLostError,
    error_from_wire,
)
from .endpoints import default_control_endpoint, default_endpoint
from .protocol import PROTOCOL_VERSION
from .questions import Choice, Image, Noul, Score, Video, questions_to_wire
from .schema import DecisionRequest, Media, Question, parse_decision

__all__ = [
    "ERROR_CLASSES",
    "PROTOCOL_VERSION",
    "Choice",
    "ContextLengthError",
    "DeadlineExceededError",
    "DecisionRequest",
    "ForbiddenError",
    "Image",
    "InternalError",
    "InvalidMessageError",
    "InvalidRequestError",
    "JevClient",
    "JevTimeoutError",
    "JevUnreachableError",
    "JevanyError",
    "Media",
    "Noul",
    "OverloadedError",
    "Question",
    "Score",
    "ShuttingDownError",
    "UnknownModelError",
    "UnknownOpError",
    "UnsupportedMediaError",
    "UnsupportedVersionError",
    "Video",
    "WorkerLostError",
    "decide_body",
    "default_control_endpoint",
    "default_endpoint",
    "error_from_wire",
    "parse_decision",
    "questions_to_wire",
]

# The client pulls in pyzmq; it loads on first use so the protocol and schema
# stay cheap to import (the daemon's workers import them too).
_LAZY = ("JevClient", "decide_body")


def __getattr__(name: str):
    if name in _LAZY:
        from . import client

        value = getattr(client, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
