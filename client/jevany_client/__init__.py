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
from .questions import Choice, Noul, Score, questions_to_wire
from .schema import DecisionRequest, Media, Question, parse_decision

__all__ = [
    "ERROR_CLASSES",
    "PROTOCOL_VERSION",
    "Choice",
    "ContextLengthError",
    "DeadlineExceededError",
    "DecisionRequest",
    "ForbiddenError",
    "InternalError",
    "InvalidMessageError",
    "InvalidRequestError",
    "JevTimeoutError",
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
    "WorkerLostError",
    "default_control_endpoint",
    "default_endpoint",
    "error_from_wire",
    "parse_decision",
    "questions_to_wire",
]
