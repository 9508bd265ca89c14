import time

import msgpack
import msgpack.fallback
import pytest

from jevany_client.errors import (
    InvalidMessageError,
    InvalidRequestError,
    OverloadedError,
    UnknownOpError,
    UnsupportedVersionError,
    error_from_wire,
)
from jevany_client.protocol import (
    CONTROL_OPS,
    MAX_ID_BYTES,
    MAX_SAFE_INT,
    PROTOCOL_VERSION,
    PUBLIC_OPS,
    Request,
    decode_reply,
    decode_request,
    encode_request,
    error_reply,
    ok_reply,
    pack,
)
from jevany_client.schema import parse_decision


class Raw(bytes):
    """Bytes spliced into a payload as they are, for things msgpack will not pack."""


def raw_map(fields: dict) -> bytes:
    assert len(fields) < 16
    out = bytes([0x80 | len(fields)])
    for key, value in fields.items():
        out += key if isinstance(key, Raw) else pack(key)
        out += value if isinstance(value, Raw) else pack(value)
    return out


def nested_arrays(levels: int) -> Raw:
    return Raw(b"\x91" * levels + b"\xc0")


def envelope(**fields) -> dict:
    return {"v": 1, "id": 7, "op": "ping", **fields}


def decode_error(payload: bytes, expected: type):
    with pytest.raises(expected) as info:
        decode_request(payload)
    return info.value


BODY = {"state": "s", "questions": {"q": {"type": "noul"}}}


# --- valid requests ---------------------------------------------------------


def test_ping_decodes_with_defaults():
    assert decode_request(pack(envelope())) == Request(
        v=1, id=7, op="ping", body=None, timeout_ms=None
    )


def test_decide_keeps_body_and_timeout():
    request = decode_request(pack(envelope(id="abc", op="decide", body=BODY, timeout_ms=250)))
    assert (request.id, request.op, request.body, request.timeout_ms) == (
        "abc",
        "decide",
        BODY,
        250,
    )


@pytest.mark.parametrize("op", PUBLIC_OPS[1:] + CONTROL_OPS)
def test_every_non_decide_op_decodes_without_a_body(op):
    assert decode_request(pack(envelope(op=op))).op == op


@pytest.mark.parametrize(
    "request_id",
    [0, MAX_SAFE_INT, -MAX_SAFE_INT, "", "x" * MAX_ID_BYTES, "é" * (MAX_ID_BYTES // 2)],
)
def test_ids_at_the_limits_are_accepted(request_id):
    assert decode_request(pack(envelope(id=request_id))).id == request_id


def test_zero_timeout_and_null_body_are_accepted():
    request = decode_request(pack(envelope(timeout_ms=0, body=None)))
    assert request.timeout_ms == 0
    assert request.body is None


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_any_bytes_like_payload_decodes(kind):
    assert decode_request(kind(pack(envelope()))).id == 7


# --- invalid_message --------------------------------------------------------

UNREADABLE = {
    "empty": b"",
    "reserved byte": b"\xc1",
    "truncated": b"\x92\x01",
    "array": pack([1, 7, "ping"]),
    "str": pack("ping"),
    "no id": pack({"v": 1, "op": "ping"}),
    "float id": pack(envelope(id=7.0)),
    "bool id": pack(envelope(id=True)),
    "nil id": pack(envelope(id=None)),
    "array id": pack(envelope(id=[7])),
    "map id": pack(envelope(id={"a": 7})),
    "long id": pack(envelope(id="x" * (MAX_ID_BYTES + 1))),
    "long utf8 id": pack(envelope(id="é" * (MAX_ID_BYTES // 2) + "x")),
    "big id": pack(envelope(id=MAX_SAFE_INT + 1)),
    "small id": pack(envelope(id=-MAX_SAFE_INT - 1)),
    "bin id": pack(envelope(id=b"7")),
    "bad utf8 id": raw_map({"v": 1, "id": Raw(b"\xa1\xff"), "op": "ping"}),
    "100k nested arrays": raw_map({"v": 1, "id": 7, "op": "ping", "body": nested_arrays(100_000)}),
    "100k nested maps": raw_map(
        {"v": 1, "id": 7, "op": "ping", "body": Raw(b"\x81\xa1k" * 100_000 + b"\xc0")}
    ),
}


@pytest.mark.parametrize("payload", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_unreadable_messages_are_invalid_without_an_id(payload):
    assert decode_error(payload, InvalidMessageError).request_id is None


READABLE_ID = {
    "trailing bytes": pack(envelope()) + b"\x00",
    "two messages": pack(envelope()) + pack(envelope(id=8)),
    "ext in body": raw_map({"v": 1, "id": 7, "op": "ping", "body": Raw(b"\xd4\x05\x00")}),
    "empty ext": raw_map({"v": 1, "id": 7, "op": "ping", "body": Raw(b"\xc7\x00\x05")}),
    "timestamp": raw_map({"v": 1, "id": 7, "op": "ping", "body": Raw(pack(msgpack.Timestamp(1)))}),
    "bad utf8 in body": raw_map({"v": 1, "id": 7, "op": "ping", "body": Raw(b"\xa1\xff")}),
    "int key": pack({**envelope(), 5: 1}),
    "bin key": pack({**envelope(), b"op2": 1}),
    "array key": raw_map({"v": 1, "id": 7, "op": "ping", Raw(b"\x91\x01"): 1}),
    "unknown key": pack(envelope(timeout=10)),
    "no v": pack({"id": 7, "op": "ping"}),
    "str v": pack(envelope(v="1")),
    "float v": pack(envelope(v=1.0)),
    "bool v": pack(envelope(v=True)),
    "no op": pack({"v": 1, "id": 7}),
    "bin op": pack(envelope(op=b"ping")),
    "int op": pack(envelope(op=1)),
}


@pytest.mark.parametrize("payload", READABLE_ID.values(), ids=READABLE_ID.keys())
def test_invalid_messages_echo_a_readable_id(payload):
    assert decode_error(payload, InvalidMessageError).request_id == 7


def test_error_messages_say_what_was_wrong():
    assert "trailing" in decode_error(READABLE_ID["trailing bytes"], InvalidMessageError).message
    assert "extension" in decode_error(READABLE_ID["timestamp"], InvalidMessageError).message
    assert "timeout" in decode_error(READABLE_ID["unknown key"], InvalidMessageError).message
    deep = UNREADABLE["100k nested arrays"]
    assert "nests" in decode_error(deep, InvalidMessageError).message


def test_deep_nesting_fails_fast_with_a_typed_error():
    # The decoder stops at its nesting limit instead of recursing (the message says so), for a
    # million levels as for 1025. The bound only catches a decoder that walks the whole payload
    # level by level: generous, so a loaded 2-core machine keeps it.
    started = time.perf_counter()
    for levels in (1025, 100_000, 1_000_000):
        payload = raw_map({"v": 1, "id": 7, "op": "decide", "body": nested_arrays(levels)})
        err = decode_error(payload, InvalidMessageError)
        assert "nests deeper than the msgpack decoder allows" in err.message
    assert time.perf_counter() - started < 10.0


def test_nesting_the_decoder_can_hold_reaches_the_schema_as_invalid_request():
    inner = b"\x91" * 1000 + b"\xc0"
    body = Raw(b"\x82\xa5state" + inner + b"\xa9questions" + pack({"q": {"type": "noul"}}))
    request = decode_request(raw_map({"v": 1, "id": 7, "op": "decide", "body": body}))
    with pytest.raises(InvalidRequestError, match="nests deeper than 64"):
        parse_decision(request.body)


def test_array_used_as_key_in_body_is_reported_by_the_schema():
    body = Raw(b"\x82\xa5state\x81\x91\x01\x02\xa9questions" + pack({"q": {"type": "noul"}}))
    request = decode_request(raw_map({"v": 1, "id": 7, "op": "decide", "body": body}))
    with pytest.raises(InvalidRequestError, match=r"state: map keys must be strings, got array"):
        parse_decision(request.body)


# --- unsupported_version, unknown_op, invalid_request -----------------------


@pytest.mark.parametrize("v", [0, 2, -1, 2**40])
def test_other_versions_are_unsupported_and_echo_the_id(v):
    err = decode_error(pack(envelope(v=v)), UnsupportedVersionError)
    assert err.request_id == 7


def test_version_is_judged_before_keys_and_op_a_later_version_may_add():
    payload = pack(envelope(v=2, op="stream", trace="t"))
    assert decode_error(payload, UnsupportedVersionError).request_id == 7


@pytest.mark.parametrize("op", ["destroy", "", "Ping", "decide "])
def test_unknown_ops_echo_the_id(op):
    err = decode_error(pack(envelope(id="r", op=op)), UnknownOpError)
    assert err.request_id == "r"


@pytest.mark.parametrize(
    "fields",
    [
        {"op": "decide"},
        {"op": "decide", "body": None},
        {"op": "decide", "body": [BODY]},
        {"op": "decide", "body": "state"},
        {"op": "ping", "body": 3},
        {"timeout_ms": -1},
        {"timeout_ms": 1.5},
        {"timeout_ms": True},
        {"timeout_ms": "100"},
        {"timeout_ms": MAX_SAFE_INT + 1},
    ],
)
def test_bad_body_or_timeout_is_invalid_request_with_the_id(fields):
    err = decode_error(pack(envelope(**fields)), InvalidRequestError)
    assert err.request_id == 7


# --- encoding ---------------------------------------------------------------


def test_encode_request_round_trips_and_omits_absent_fields():
    payload = encode_request("a", "decide", BODY, timeout_ms=5)
    assert decode_request(payload) == Request(1, "a", "decide", BODY, 5)
    assert msgpack.unpackb(encode_request(3, "ping")) == {"v": 1, "id": 3, "op": "ping"}


@pytest.mark.parametrize("request_id", [1.0, None, True, "x" * 300, 2**53, "\ud800"])
def test_encode_request_refuses_ids_the_daemon_would_refuse(request_id):
    with pytest.raises(InvalidMessageError):
        encode_request(request_id, "ping")


def test_encode_request_refuses_negative_timeout():
    with pytest.raises(InvalidRequestError):
        encode_request(1, "ping", timeout_ms=-5)


def test_pack_keeps_bytes_and_str_apart():
    assert msgpack.unpackb(pack([b"a", "a"]), raw=True) == [b"a", b"a"]
    assert pack(b"a")[0] == 0xC4  # bin 8
    assert pack("a")[0] == 0xA1  # fixstr


# --- replies ----------------------------------------------------------------


def test_reply_shapes_match_the_protocol():
    assert ok_reply(7, {"pong": True}) == {"v": 1, "id": 7, "ok": True, "result": {"pong": True}}
    assert error_reply(None, OverloadedError("full")) == {
        "v": PROTOCOL_VERSION,
        "id": None,
        "ok": False,
        "error": {"code": "overloaded", "message": "full", "retryable": True},
    }


def test_replies_round_trip_and_errors_rebuild_their_class():
    ok = decode_reply(pack(ok_reply("a", {"answers": {"q": {"noul": 0.5}}})))
    assert ok["result"]["answers"]["q"]["noul"] == 0.5
    failed = decode_reply(pack(error_reply(7, OverloadedError("full"))))
    assert isinstance(error_from_wire(failed["error"], failed["id"]), OverloadedError)


def test_reply_with_nan_latency_is_still_a_reply():
    reply = decode_reply(pack(ok_reply(1, {"latency_ms": float("nan")})))
    assert reply["ok"] is True


BAD_REPLIES = {
    "garbage": b"\xc1\x00",
    "not a map": pack([1]),
    "no id": pack({"v": 1, "ok": True, "result": {}}),
    "bad id": pack({"v": 1, "id": 1.5, "ok": True, "result": {}}),
    "no v": pack({"id": 1, "ok": True, "result": {}}),
    "ok not bool": pack({"v": 1, "id": 1, "ok": 1, "result": {}}),
    "no result": pack({"v": 1, "id": 1, "ok": True}),
    "result not map": pack({"v": 1, "id": 1, "ok": True, "result": [1]}),
    "no error": pack({"v": 1, "id": 1, "ok": False}),
    "error without retryable": pack(
        {"v": 1, "id": 1, "ok": False, "error": {"code": "internal", "message": "m"}}
    ),
    "bin in result": pack(ok_reply(1, {"version": b"1.0"})),
    "int key in result": pack(ok_reply(1, {"histogram": {1: 2}})),
    "deep": raw_map({"v": 1, "id": 1, "ok": True, "result": nested_arrays(5000)}),
}


@pytest.mark.parametrize("payload", BAD_REPLIES.values(), ids=BAD_REPLIES.keys())
def test_malformed_replies_are_invalid_messages(payload):
    with pytest.raises(InvalidMessageError):
        decode_reply(payload)


def test_reply_in_another_version_is_unsupported():
    with pytest.raises(UnsupportedVersionError) as info:
        decode_reply(pack({**ok_reply(4, {}), "v": 2}))
    assert info.value.request_id == 4


def test_pure_python_msgpack_also_fails_typed(monkeypatch):
    # Without the C extension msgpack recurses in Python; it must still end typed.
    monkeypatch.setattr(msgpack, "unpackb", msgpack.fallback.unpackb)
    for payload in (UNREADABLE["100k nested arrays"], READABLE_ID["timestamp"]):
        decode_error(payload, InvalidMessageError)
    assert decode_request(pack(envelope())).id == 7
