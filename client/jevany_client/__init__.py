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
from .bodies import decide_body
from .endpoints import default_control_endpoint, default_endpoint
from .protocol import PROTOCOL_VERSION
from .questions import Choice, Image, Noul, Score, Video, questions_to_wire
from .schema import DecisionRequest, Media, Question, parse_decision

__all__ = [
    "ERROR_CLASSES",
    "AsyncJevClient",
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

# The clients pull in pyzmq (and asyncio); each loads on first use so the
# protocol and schema stay cheap to import (the daemon's workers import them too).
_LAZY = ("AsyncJevClient", "JevClient")


def __getattr__(name: str):
    # Plain import statements, not importlib, so `python -X importtime` still times them.
    if name == "JevClient":
        from .client import JevClient as value
    elif name == "AsyncJevClient":
        from .async_client import AsyncJevClient as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
