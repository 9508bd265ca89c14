"""Fuzzing the decoding path in-process: whatever arrives, a typed JevanyError or a request, fast.

decode_request and parse_decision are what the supervisor runs on every
message in its one loop; any other exception there would take the daemon
down, and any slow or memory-hungry path would stall every client.
"""
import math
import sys
import time
import tracemalloc

import msgpack
import pytest
from hypothesis import assume, example, given, strategies as st

from jevany_client._values import _container_problem, _is_container, _scalar_problem, find_problem, format_path
from jevany_client.errors import (
    ERROR_CLASSES,
    InvalidMessageError,
    InvalidRequestError,
    JevanyError,
    UnknownOpError,
    UnsupportedVersionError,
)
from jevany_client.protocol import (MAX_DEPTH, MAX_ID_BYTES, MAX_KEYS, MAX_SAFE_INT, Request, _unpack_noting,
                                    decode_envelope, decode_reply, decode_request)
from jevany_client.schema import DecisionRequest, parse_decision
from jevany_daemon.server.client_ops import CHECKED_WHOLE_BYTES, decide_media, decoded

from . import strategies as s
from .harness import pack

GOOD_BODY = {"state": "s", "questions": {"q": {"type": "noul"}}}
UNREADABLE = object()


def asking(question: dict) -> dict:
    return {"state": 1, "questions": {"q": question}}


def request(**fields) -> dict:
    return {"v": 1, "id": "r1", "op": "decide", "body": GOOD_BODY, **fields}


def is_valid_id(value) -> bool:
    if type(value) is int:
        return -MAX_SAFE_INT <= value <= MAX_SAFE_INT
    return type(value) is str and len(value.encode("utf-8", "surrogatepass")) <= MAX_ID_BYTES


def readable_id(payload: bytes):
    """The id a reader could take from the payload, by a plain msgpack decode; UNREADABLE otherwise."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=lambda code, data: None)
    except Exception:   # noqa: BLE001 - anything undecodable has no readable id
        return UNREADABLE
    if isinstance(obj, dict) and is_valid_id(obj.get("id")):
        return obj["id"]
    return UNREADABLE


def supervisor_path(payload: bytes):
    """What the supervisor does with a message before queueing it: decode, then check a decide body."""
    req = decoded(payload)
    if req.op == "decide":
        try:
            decide_media(req, payload)
        except JevanyError as err:
            assert err.code == "invalid_request", err
            raise type(err)(err.message, request_id=req.id) from None
    return req


def assert_typed(err: JevanyError) -> None:
    assert type(err) is ERROR_CLASSES[err.code]
    assert err.retryable is ERROR_CLASSES[err.code].retryable
    assert isinstance(err.message, str) and err.message
    assert err.request_id is None or is_valid_id(err.request_id)


# --- anything at all ---------------------------------------------------------------------


@s.fuzz_settings(300)
@given(s.payload)
@example(b"")
@example(b"\xc1")
@example(b"\x91" * 10_000 + b"\xc0")
@example(b"\xdd\xff\xff\xff\xff")
def test_any_payload_gives_a_request_or_a_typed_error(payload):
    started = time.perf_counter()
    try:
        req = supervisor_path(payload)
    except JevanyError as err:
        assert_typed(err)
        expected = readable_id(payload)
        if expected is not UNREADABLE:
            assert err.request_id == expected, "an error must echo an id the daemon could read"
    else:
        assert isinstance(req, Request) and req.v == 1 and req.id == readable_id(payload)
    # Catches a path that stalls the supervisor's loop for seconds; generous, so a loaded 2-core
    # machine keeps it.
    assert time.perf_counter() - started < 10.0


@s.fuzz_settings(150)
@given(s.ANY_VALUE.map(s.pack_or_none).filter(bool) | st.binary(max_size=200))
def test_the_client_reply_decoder_only_raises_typed_errors(payload):
    try:
        reply = decode_reply(payload)
    except JevanyError as err:
        assert_typed(err)
    else:
        assert type(reply["ok"]) is bool and reply["v"] == 1


@s.fuzz_settings(300)
@given(s.ANY_VALUE)
def test_a_reply_whose_decoding_noted_nothing_odd_is_one_the_walk_finds_clean(value):
    # decode_reply walks a reply only when the decoder's hooks saw a key that is not a str or a bin
    # value: the walk must never find anything in one they did not flag.
    payload = s.pack_or_none({"v": 1, "id": "r1", "ok": True, "result": {"answers": value}})
    assume(payload is not None)
    try:
        reply, budget = _unpack_noting(payload)
    except JevanyError:
        return
    found = find_problem(reply, "reply", finite=False)
    assert found is None or budget.odd, found
    try:
        decode_reply(payload)
    except InvalidMessageError as err:
        assert found is not None and err.message == f"{found[0]}: {found[1]}"
    else:
        assert found is None


@s.fuzz_settings(50)
@given(s.valid_body, s.VALID_ID)
def test_every_strict_prefix_of_a_request_is_invalid_message(body, rid):
    payload = pack({"v": 1, "id": rid, "op": "decide", "body": body})
    for cut in range(len(payload)):
        with pytest.raises(InvalidMessageError):
            decode_request(payload[:cut])


# --- valid and almost valid bodies ---------------------------------------------------------------


@s.fuzz_settings(150)
@given(s.valid_body, s.VALID_ID)
def test_every_valid_body_is_accepted_unchanged(body, rid):
    req = decode_request(pack({"v": 1, "id": rid, "op": "decide", "body": body, "timeout_ms": 5}))
    assert (req.id, req.op, req.timeout_ms) == (rid, "decide", 5)
    parsed = parse_decision(req.body)
    assert isinstance(parsed, DecisionRequest)
    assert [q.qid for q in parsed.questions] == list(body["questions"])
    assert parsed.state == body["state"] or _has_nan(body["state"])


def has_extension(value) -> bool:
    if isinstance(value, (msgpack.ExtType, msgpack.Timestamp)):
        return True
    if isinstance(value, dict):
        return any(has_extension(k) or has_extension(v) for k, v in value.items())
    return isinstance(value, (list, tuple)) and any(map(has_extension, value))


def _has_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


@s.fuzz_settings(150)
@given(s.poisoned_body())
def test_one_forbidden_value_anywhere_in_a_body_is_invalid_request(body):
    with pytest.raises(InvalidRequestError) as err:
        parse_decision(body)
    assert ": " in err.value.message   # "path: problem"


@s.fuzz_settings(100)
@given(s.poisoned_body(s.WIRE_POISONS), s.VALID_ID)
def test_over_the_wire_too_with_the_id_echoed(body, rid):
    with pytest.raises(InvalidRequestError) as err:
        supervisor_path(pack({"v": 1, "id": rid, "op": "decide", "body": body}))
    assert err.value.request_id == rid


@s.fuzz_settings(75)
@given(s.poisoned_body(s.EXTENSIONS), s.VALID_ID)
def test_an_extension_type_anywhere_is_invalid_message_with_the_id(body, rid):
    with pytest.raises(InvalidMessageError, match="extension") as err:
        decode_request(pack({"v": 1, "id": rid, "op": "decide", "body": body}))
    assert err.value.request_id == rid


# --- envelope fields of the wrong type (PROTOCOL.md, "Request") ----------------------------------


@s.fuzz_settings(75)
@given(s.ANY_VALUE.filter(lambda v: type(v) is not int and not has_extension(v)))
def test_v_that_is_not_an_int_is_invalid_message(v):
    payload = s.pack_or_none(request(v=v))
    assume(payload is not None)
    with pytest.raises(InvalidMessageError) as err:
        decode_request(payload)
    assert err.value.request_id == "r1"


@s.fuzz_settings(50)
@given(s.INT64.filter(lambda v: v != 1))
def test_any_other_version_is_unsupported_version(v):
    with pytest.raises(UnsupportedVersionError) as err:
        decode_request(pack(request(v=v)))
    assert err.value.request_id == "r1"


@s.fuzz_settings(100)
@given(s.ANY_VALUE.filter(lambda v: not is_valid_id(v)))
def test_an_unusable_id_is_invalid_message_with_a_null_id(rid):
    payload = s.pack_or_none(request(id=rid))
    assume(payload is not None)
    with pytest.raises(InvalidMessageError) as err:
        decode_request(payload)
    assert err.value.request_id is None


@s.fuzz_settings(75)
@given(s.ANY_VALUE.filter(lambda v: not has_extension(v)))
def test_op_must_be_a_known_str(op):
    payload = s.pack_or_none(request(op=op))
    assume(payload is not None)
    if op in ("decide", "ping", "status", "models", "drain", "reload", "clear_cache"):
        assert decode_request(payload).op == op
        return
    expected = UnknownOpError if type(op) is str else InvalidMessageError
    with pytest.raises(expected) as err:
        decode_request(payload)
    assert err.value.request_id == "r1"


@s.fuzz_settings(75)
@given(s.ANY_VALUE.filter(lambda v: v is not None and not isinstance(v, dict) and not has_extension(v)))
def test_a_body_that_is_not_a_map_is_invalid_request(body):
    payload = s.pack_or_none(request(body=body))
    assume(payload is not None)
    with pytest.raises(InvalidRequestError) as err:
        decode_request(payload)
    assert err.value.request_id == "r1"


# --- the extremes the issue names, each with its exact outcome -----------------------------------


def _raw_map(pairs) -> bytes:
    return msgpack.Packer(use_bin_type=True).pack_map_pairs(pairs)


CHOICE_100K = {"type": "choice", "criteria": {f"o{i}": None for i in range(100_000)}}
WIRE_CASES = {
    "10,000 nested arrays": (b"\x91" * 10_000 + b"\xc0", InvalidMessageError, None),
    "10,000 nested maps": (b"\x81\xa1k" * 10_000 + b"\xc0", InvalidMessageError, None),
    "state nested 1,000 deep": (pack(request(body={**GOOD_BODY, "state": s.nested(1000)})), InvalidRequestError, "r1"),
    "state nested 65 deep in maps": (pack(request(body={**GOOD_BODY, "state": s.nested(64, kind=dict)})),
                                     InvalidRequestError, "r1"),
    "5,000 questions": (pack(request(body={"state": 1, "questions": {f"q{i}": {"type": "noul"} for i in range(5000)}})),
                        InvalidRequestError, "r1"),
    "100,000 options": (pack(request(body={"state": 1, "questions": {"q": CHOICE_100K}})), InvalidRequestError, "r1"),
    "100,000 score levels": (pack(request(body={"state": 1, "questions": {"q": {"type": "score",
                                                                                 "criteria": list(range(100_000))}}})),
                             InvalidRequestError, "r1"),
    "unknown question type": (pack(request(body={"state": 1, "questions": {"q": {"type": "rank"}}})),
                              InvalidRequestError, "r1"),
    "question type not a str": (pack(request(body={"state": 1, "questions": {"q": {"type": ["choice"]}}})),
                                InvalidRequestError, "r1"),
    "NaN state": (pack(request(body={**GOOD_BODY, "state": [1, {"x": float("nan")}]})), InvalidRequestError, "r1"),
    "infinite criterion": (pack(request(body=asking({"type": "score", "criteria": [1, float("inf")]}))),
                           InvalidRequestError, "r1"),
    "bin id": (pack(request(id=b"r1")), InvalidMessageError, None),
    "bin op": (pack(request(op=b"decide")), InvalidMessageError, "r1"),
    "bin v": (pack(request(v=b"\x01")), InvalidMessageError, "r1"),
    "bin state": (pack(request(body={**GOOD_BODY, "state": b"s"})), InvalidRequestError, "r1"),
    "bin question id": (pack(request(body={"state": 1, "questions": {b"q": {"type": "noul"}}})),
                        InvalidRequestError, "r1"),
    "bin envelope key": (pack({**request(), b"op": "ping"}), InvalidMessageError, "r1"),
    "int envelope key": (pack({**request(), 1: 2}), InvalidMessageError, "r1"),
    "array key in state": (pack(request(body={**GOOD_BODY, "state": {(1, 2): 3}})), InvalidRequestError, "r1"),
    "map key in state": (b"\x84" + pack("v") + pack(1) + pack("id") + pack("r1") + pack("op") + pack("decide")
                         + pack("body") + b"\x82" + pack("state") + b"\x81\x80\x01"     # {{}: 1}
                         + pack("questions") + pack(GOOD_BODY["questions"]), InvalidRequestError, "r1"),
    "ext at the top": (pack(msgpack.ExtType(1, b"x")), InvalidMessageError, None),
    "ext as the id": (pack(request(id=msgpack.ExtType(1, b"x"))), InvalidMessageError, None),
    "timestamp in state": (pack(request(body={**GOOD_BODY, "state": msgpack.Timestamp(1, 0)})),
                           InvalidMessageError, "r1"),
    "trailing bytes": (pack(request()) + b"\xc0", InvalidMessageError, "r1"),
    "invalid UTF-8 in op": (b"\x84\xa1v\x01\xa2id\xa2r1\xa2op\xa2\xff\xfe\xa4body\x80", InvalidMessageError, "r1"),
    "array32 header claiming 4G items": (b"\xdd\xff\xff\xff\xff", InvalidMessageError, None),
    "map32 header claiming 4G pairs": (b"\xdf\xff\xff\xff\xff", InvalidMessageError, None),
    "timeout_ms negative": (pack(request(timeout_ms=-1)), InvalidRequestError, "r1"),
    "id past 2^53": (pack(request(id=2**53)), InvalidMessageError, None),
    "v = true": (pack(request(v=True)), InvalidMessageError, "r1"),
}


def worker_path(payload: bytes) -> DecisionRequest:
    """What the worker does with a decide message the supervisor queued: decode it whole, then parse it."""
    return parse_decision(decode_request(payload).body)


@pytest.mark.parametrize("case", list(WIRE_CASES))
def test_named_extremes_over_the_wire(case):
    # Refused by the supervisor; or, past what it checks whole, by the worker that would score it.
    payload, expected, rid = WIRE_CASES[case]
    started = time.perf_counter()
    with pytest.raises(expected) as err:
        if supervisor_path(payload).op == "decide" and len(payload) > CHECKED_WHOLE_BYTES:
            try:
                worker_path(payload)
            except JevanyError as exc:
                raise type(exc)(exc.message, request_id=rid) from None
    assert time.perf_counter() - started < 2.0
    assert err.value.request_id == rid


BIG = 2**64
IN_PROCESS_CASES = {
    "state nested 10,000 deep": {**GOOD_BODY, "state": s.nested(10_000)},
    "criteria nested 10,000 deep": asking({"type": "choice", "criteria": {"a": s.nested(10_000, kind=dict)}}),
    "integer past 64 bits in state": {**GOOD_BODY, "state": {"n": BIG}},
    "integer below int64 in instructions": asking({"type": "noul", "instructions": -(2**63) - 1}),
    "huge integer in a score level": asking({"type": "score", "criteria": [0, 10**400]}),
    "5,000 questions": {"state": 1, "questions": {f"q{i}": {"type": "noul"} for i in range(5000)}},
    "100,000 options": {"state": 1, "questions": {"q": CHOICE_100K}},
    "a set in state": {**GOOD_BODY, "state": {1, 2}},
    "bytes as a question id": {"state": 1, "questions": {b"q": {"type": "noul"}}},
}


@pytest.mark.parametrize("case", list(IN_PROCESS_CASES))
def test_named_extremes_in_process(case):
    started = time.perf_counter()
    with pytest.raises(InvalidRequestError):
        parse_decision(IN_PROCESS_CASES[case])
    assert time.perf_counter() - started < 2.0


def test_duplicate_keys_take_the_last_value_as_every_msgpack_reader_does():
    # PROTOCOL.md does not forbid duplicates; Python's and @msgpack/msgpack's readers both keep the last.
    req = decode_request(_raw_map([("v", 1), ("id", "first"), ("op", "ping"), ("id", "last")]))
    assert req.id == "last"
    with pytest.raises(UnsupportedVersionError):
        decode_request(_raw_map([("v", 1), ("id", "a"), ("op", "ping"), ("v", 2)]))


# --- size: a max-size message must cost time and memory in proportion to its bytes ---------------

MAX_MESSAGE = 8 << 20   # the daemon's default --max-message-bytes


@pytest.mark.parametrize("shape", ["integers", "nils", "strings", "empty arrays", "empty maps"])
def test_a_max_size_message_is_refused_quickly_for_its_counts(shape):
    n = MAX_MESSAGE - 64
    state = {"integers": [0] * n, "nils": [None] * n, "empty arrays": [[]] * n, "strings": [""] * n,
             "empty maps": [{}] * n}[shape]
    payload = pack(request(body={**GOOD_BODY, "state": state}))
    assert len(payload) <= MAX_MESSAGE
    del state
    tracemalloc.start()
    try:
        assert supervisor_path(payload).id == "r1"     # its envelope read, its body skipped unbuilt
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the decoder's read buffer: building the body would take 64 MiB and more
    assert peak < 3 << 20, f"peak {peak / 2**20:.1f} MiB in the supervisor's loop"
    started = time.perf_counter()
    with pytest.raises(InvalidRequestError) as err:
        worker_path(payload)
    # Was 44 s for 8 M integers, with 1.8 GB of path tuples, stalling every client of the daemon;
    # then 6.5 s and 1.6 GB for 8 M empty maps, decoded one by one through a Python hook.
    assert time.perf_counter() - started < 5.0
    assert "more than 1,048,576 values" in err.value.message


def test_checking_a_flat_array_allocates_nothing_per_value():
    body = {**GOOD_BODY, "state": [0] * 1_000_000}
    nested_body = {**GOOD_BODY, "state": [[0]] * 200_000}
    tracemalloc.start()
    try:
        parse_decision(body)
        parse_decision(nested_body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB while checking"   # was 228 MiB for the first


# --- the optimised walk agrees with the obvious recursive one ----------------------------------------


def reference_problem(value, root, depth=1, node=None, max_depth=MAX_DEPTH, finite=True):
    if _is_container(value):
        problem = _container_problem(value, depth, max_depth)
        if problem is not None:
            return format_path(node, root), problem
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        for step, child in pairs:
            found = reference_problem(child, root, depth + 1, (node, step), max_depth, finite)
            if found is not None:
                return found
        return None
    problem = _scalar_problem(value, finite)
    return None if problem is None else (format_path(node, root), problem)


LONG_FLAT = st.one_of(st.lists(s.INT64, min_size=20, max_size=40), st.lists(st.floats(), min_size=20, max_size=40),
                      st.lists(st.one_of(st.none(), st.booleans(), s.TEXT), min_size=20, max_size=40))


@s.fuzz_settings(200)
@given(st.recursive(s.SCALARS | LONG_FLAT | st.integers(2**64, 2**70),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(s.KEYS, inner, max_size=5),
                    max_leaves=30),
       st.sampled_from([3, MAX_DEPTH]), st.booleans())
def test_the_walk_finds_what_a_plain_recursive_walk_finds(value, max_depth, finite):
    expected = reference_problem(value, "state", max_depth=max_depth, finite=finite)
    assert find_problem(value, "state", max_depth=max_depth, finite=finite) == expected


LONG_MIXED = st.lists(st.one_of(s.SCALARS, st.integers(2**64, 2**70), st.lists(s.SCALARS, max_size=3),
                                st.dictionaries(s.KEYS, s.SCALARS, max_size=3)), min_size=17, max_size=60)


@s.fuzz_settings(200)
@given(st.one_of(LONG_MIXED, st.dictionaries(s.TEXT, LONG_MIXED | s.SCALARS, min_size=17, max_size=40)),
       st.booleans())
def test_long_mixed_containers_are_checked_as_the_plain_walk_checks_them(value, finite):
    # Containers past sixteen values are checked pass by pass at C speed, scalars and nested containers
    # interleaved: the first problem in document order must still be the one reported.
    expected = reference_problem(value, "state", finite=finite)
    assert find_problem(value, "state", max_depth=MAX_DEPTH, finite=finite) == expected


def _python_calls(run) -> int:
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"
    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("state", [[1] * 1_000_000 + [b"x"], [1, "a"] * 500_000 + [float("nan")],
                                   {f"k{i}": i if i % 2 else "v" for i in range(200_000)} | {"x": b""}])
def test_the_walk_runs_python_per_container_not_per_value(state):
    # A million small integers and one bin value took the supervisor's loop 0.65 s when each value was
    # visited; ten such messages held a concurrent ping for 3.9 s.
    with pytest.raises(InvalidRequestError):
        parse_decision({**GOOD_BODY, "state": state})
    assert _python_calls(lambda: find_problem(state, "state", max_depth=MAX_DEPTH)) < 100


ENVELOPE_KEYS = frozenset(("media", "state"))


@s.fuzz_settings(300)
@given(s.payload)
@example(_raw_map([("v", 1), ("id", "r"), ("op", "decide"), ("body", {f"k{i}": 1 for i in range(17)})]))
def test_the_envelope_alone_agrees_with_the_whole_decode(payload):
    # What the supervisor reads of a big message: never more lenient about the envelope than the whole
    # decode, and never stricter but for a map with more keys than any request has.
    try:
        whole = decode_request(payload)
    except JevanyError as err:
        whole = err
    try:
        envelope = decode_envelope(payload, ENVELOPE_KEYS)
    except JevanyError as err:
        envelope = err
    if isinstance(whole, Request):
        if isinstance(envelope, JevanyError):
            assert "more than any request has" in envelope.message and len(whole.body or {}) > MAX_KEYS
            return
        kept = None if whole.body is None else {k: v for k, v in whole.body.items() if k in ENVELOPE_KEYS}
        assert (envelope.v, envelope.id, envelope.op, envelope.timeout_ms) == \
            (whole.v, whole.id, whole.op, whole.timeout_ms)
        assert msgpack.packb(envelope.body) == msgpack.packb(kept)      # NaN is not equal to itself
    elif isinstance(envelope, Request):
        # what only the whole decode sees lies in the body's skipped values: the worker that decodes it
        # whole refuses it then, for its bytes or its counts
        assert isinstance(envelope.body, dict) and whole.code in ("invalid_message", "invalid_request")


def test_the_envelope_is_read_without_building_the_body():
    payload = pack(request(body={**GOOD_BODY, "state": [{"a": [1, 2]}] * 200_000}))
    tracemalloc.start()
    try:
        envelope = decode_envelope(payload, frozenset(("media",)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (envelope.id, envelope.op, envelope.body) == ("r1", "decide", {})
    assert peak < 3 << 20, f"peak {peak / 2**20:.1f} MiB"   # the read buffer; the body built: 200,000 maps, 40 MiB
