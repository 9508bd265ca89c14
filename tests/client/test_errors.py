import pickle

import pytest

from jevany_client import errors
from jevany_client.errors import (
    ERROR_CLASSES,
    InternalError,
    InvalidMessageError,
    JevanyError,
    OverloadedError,
    error_from_wire,
)

# The table in PROTOCOL.md, copied by hand so a drift in either shows up here.
PROTOCOL_TABLE = {
    "invalid_message": ("InvalidMessageError", False),
    "unsupported_version": ("UnsupportedVersionError", False),
    "unknown_op": ("UnknownOpError", False),
    "forbidden": ("ForbiddenError", False),
    "invalid_request": ("InvalidRequestError", False),
    "unknown_model": ("UnknownModelError", False),
    "context_length_exceeded": ("ContextLengthError", False),
    "unsupported_media": ("UnsupportedMediaError", False),
    "overloaded": ("OverloadedError", True),
    "deadline_exceeded": ("DeadlineExceededError", True),
    "shutting_down": ("ShuttingDownError", True),
    "worker_lost": ("WorkerLostError", True),
    "internal": ("InternalError", False),
}


def test_error_classes_cover_exactly_the_protocol_codes():
    assert set(ERROR_CLASSES) == set(PROTOCOL_TABLE)


@pytest.mark.parametrize("code", sorted(PROTOCOL_TABLE))
def test_each_code_has_its_class_and_retry_advice(code):
    name, retryable = PROTOCOL_TABLE[code]
    cls = getattr(errors, name)
    assert ERROR_CLASSES[code] is cls
    assert issubclass(cls, JevanyError)
    assert cls.code == code
    assert cls.retryable is retryable


@pytest.mark.parametrize("code", sorted(PROTOCOL_TABLE))
def test_round_trip_through_the_wire_keeps_class_and_message(code):
    original = ERROR_CLASSES[code]("it went wrong", request_id="r1")
    wire = original.to_wire()
    assert wire == {"code": code, "message": "it went wrong", "retryable": original.retryable}
    rebuilt = error_from_wire(wire, request_id="r1")
    assert type(rebuilt) is type(original)
    assert rebuilt.message == "it went wrong"
    assert rebuilt.request_id == "r1"
    assert rebuilt.retryable is original.retryable


def test_message_is_the_exception_text_and_request_id_defaults_to_none():
    err = OverloadedError("queue full")
    assert str(err) == "queue full"
    assert err.message == "queue full"
    assert err.request_id is None
    assert err.args == ("queue full",)       # what a traceback or a log line prints


def test_unknown_code_becomes_plain_error_keeping_code_and_retryable():
    err = error_from_wire({"code": "rate_limited", "message": "slow down", "retryable": True})
    assert type(err) is JevanyError
    assert err.code == "rate_limited"
    assert err.retryable is True
    assert err.to_wire() == {"code": "rate_limited", "message": "slow down", "retryable": True}


def test_unknown_code_override_does_not_leak_into_the_class():
    error_from_wire({"code": "rate_limited", "message": "", "retryable": True})
    assert JevanyError.code == "internal"
    assert JevanyError.retryable is False


def test_known_code_takes_retryable_from_the_protocol_not_the_sender():
    err = error_from_wire({"code": "overloaded", "message": "busy", "retryable": False})
    assert isinstance(err, OverloadedError)
    assert err.retryable is True


@pytest.mark.parametrize("wire", [None, "internal", {}, {"code": 3, "message": "x"}])
def test_malformed_error_object_is_an_invalid_message(wire):
    with pytest.raises(InvalidMessageError):
        error_from_wire(wire)


def test_missing_message_becomes_empty_text():
    err = error_from_wire({"code": "internal"})
    assert isinstance(err, InternalError)
    assert err.message == ""


def test_pickle_keeps_class_id_and_overrides():
    for err in (
        OverloadedError("busy", request_id=7),
        JevanyError("odd", request_id="x", code="rate_limited", retryable=True),
    ):
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err)
        assert copy.to_wire() == err.to_wire()
        assert copy.request_id == err.request_id
