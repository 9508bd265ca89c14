"""jevany-client: the wire protocol, request schema and client for jevany-daemon. No torch.

protocol.py      version 1 of the wire envelope: strict decoding, replies, packing
_values.py       one walk over decoded msgpack values: types, keys, finiteness, depth
schema.py        the decide body: JevAny's field rules, checked without recursion
errors.py        typed errors that cross the wire as codes and come back as the same classes
bodies.py        decide bodies from typed questions and media, or from maps
questions.py     Choice, Noul, Score, Image, Video: builders instead of wire maps
render.py        JevAny's text rendering of request values, byte for byte
answers.py       probabilities to JevAny's answer shapes, and its self-check of an answer
endpoints.py     where the daemon listens by default (shared with the daemon)
ipc_trust.py     whether an ipc socket's path can be trusted
keys.py          the CurveZMQ keys a client connects with
calls.py         what both clients share: options, request ids, the socket, one call's tries
client.py        JevClient: one DEALER per daemon, pipelined requests, replies matched by id
async_client.py  AsyncJevClient: many calls in flight over one DEALER per daemon
awaited.py       what AsyncJevClient's calls wait on
fleet.py         the daemons a client routes over, one Peer each
routing.py       which daemon gets a request: the policies, without sockets
discovery.py     dns+tcp:// endpoints, resolved again every few seconds
streaming.py     many requests, a bounded number in flight, each outcome handed on when in
status_page.py   jevany-ctl's status and models pages
cli.py           the jevany-client, jevany-ctl and jevany-eval command lines
"""

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
