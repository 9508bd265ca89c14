"""Hypothesis strategies for hostile and valid protocol messages, shared by the fuzz tests.

`valid_body` draws decide bodies every JevAny rule accepts; `poisoned_body`
draws the same with exactly one forbidden value (NaN, infinity, bin, a
non-string key, nesting past 64 levels, an integer past 64 bits) planted where
a JSON value belongs; `payload` draws raw bytes from every family the issue
names.
"""
import os

import msgpack
from hypothesis import HealthCheck, settings, strategies as st

from .harness import pack

# CI runs the bounded default; a release check runs e.g. JEVANY_FUZZ_EXAMPLES=5000.
FUZZ_EXAMPLES = int(os.environ.get("JEVANY_FUZZ_EXAMPLES", "0")) or None


def fuzz_settings(default_examples: int):
    """Deterministic (derandomized, no example database) unless JEVANY_FUZZ_SEED asks for fresh examples."""
    return settings(
        max_examples=FUZZ_EXAMPLES or default_examples,
        deadline=None,
        derandomize="JEVANY_FUZZ_SEED" not in os.environ,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture],
    )


INT64 = st.integers(-(2**63), 2**64 - 1)            # every integer msgpack can carry
SAFE_ID_INT = st.integers(-(2**53 - 1), 2**53 - 1)
TEXT = st.text(max_size=24)
NAME = st.text(min_size=1, max_size=10)

# --- every msgpack value, well formed or not ----------------------------------------------

EXTENSIONS = st.one_of(
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)),
    st.builds(msgpack.Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 999_999_999)),
)
SCALARS = st.one_of(st.none(), st.booleans(), INT64, st.floats(), TEXT, st.binary(max_size=24), EXTENSIONS)
# A tuple packs as an array: the way to put an array where a map key belongs.
KEYS = st.one_of(TEXT, st.integers(-9, 9), st.binary(max_size=6), st.none(), st.booleans(), st.floats(),
                 st.tuples(st.integers(-9, 9)))
ANY_VALUE = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(KEYS, inner, max_size=6), max_leaves=40
)

# --- values every rule accepts --------------------------------------------------------------

JSON_SCALARS = st.one_of(st.none(), st.booleans(), INT64, st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSON_VALUE = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5), max_leaves=25
)


def nested(levels: int, leaf=None, kind=list):
    """`levels` containers, one inside the next, built without recursion."""
    value = leaf
    for _ in range(levels):
        value = [value] if kind is list else {"k": value}
    return value


def _question(json_value):
    choice = st.fixed_dictionaries(
        {"type": st.just("choice"), "criteria": st.dictionaries(NAME, json_value, min_size=1, max_size=5)},
        optional={"instructions": json_value},
    )
    noul = st.fixed_dictionaries(
        {"type": st.just("noul")},
        optional={"instructions": json_value,
                  "criteria": st.fixed_dictionaries({}, optional={"false": json_value, "true": json_value})},
    )
    score = st.fixed_dictionaries(
        {"type": st.just("score"), "criteria": st.lists(json_value, min_size=2, max_size=5)},
        optional={"instructions": json_value},
    )
    return st.one_of(choice, noul, score)


def _body(json_value):
    return st.fixed_dictionaries(
        {"state": json_value, "questions": st.dictionaries(NAME, _question(json_value), min_size=1, max_size=3)},
        optional={"model": st.just("jevany-latest")},
    )


valid_body = _body(JSON_VALUE)

# --- exactly one forbidden value, planted where a JSON value belongs --------------------------

POISONS = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.binary(max_size=8),
    st.dictionaries(st.one_of(st.integers(-9, 9), st.binary(min_size=1, max_size=4), st.none(), st.booleans()),
                    JSON_SCALARS, min_size=1, max_size=2),
    st.integers(65, 200).map(nested),            # past the 64-level limit
    st.one_of(st.integers(2**64, 2**80), st.integers(-(2**80), -(2**63) - 1)),   # in-process only
)


def _planted(draw_poison):
    """A JSON value with the poison at a drawn place inside it (or as the value itself)."""
    return st.recursive(
        draw_poison,
        lambda inner: st.one_of(
            st.tuples(st.lists(JSON_VALUE, max_size=3), inner, st.lists(JSON_VALUE, max_size=3))
              .map(lambda t: [*t[0], t[1], *t[2]]),
            st.tuples(st.dictionaries(TEXT, JSON_VALUE, max_size=3), NAME, inner)
              .map(lambda t: {**{k: v for k, v in t[0].items() if k != t[1]}, t[1]: t[2]}),
        ),
        max_leaves=4,
    )


@st.composite
def poisoned_body(draw, poisons=POISONS):
    """A valid body with one forbidden value in the state, an instructions field or a criterion."""
    body = draw(valid_body)
    bad = draw(_planted(poisons))
    qid = draw(st.sampled_from(sorted(body["questions"])))
    question = body["questions"][qid]
    where = draw(st.sampled_from(["state", "instructions", "criterion"]))
    if where == "state":
        body["state"] = bad
    elif where == "instructions" or question["type"] == "noul":
        question["instructions"] = bad
    elif question["type"] == "choice":
        question["criteria"][draw(st.sampled_from(sorted(question["criteria"])))] = bad
    else:
        question["criteria"][draw(st.integers(0, len(question["criteria"]) - 1))] = bad
    return body


WIRE_POISONS = POISONS.filter(lambda p: not isinstance(p, int))   # msgpack cannot carry the big ints

# --- envelopes and payloads -------------------------------------------------------------------

VALID_ID = st.one_of(SAFE_ID_INT, st.text(max_size=64))
OPS = st.sampled_from(["decide", "ping", "status", "models", "drain", "reload", "clear_cache", "explode", ""])


@st.composite
def envelope(draw, body=valid_body):
    """A request map whose fields are each either right or drawn from every msgpack type."""
    message = {
        "v": draw(st.just(1) | ANY_VALUE),
        "id": draw(VALID_ID | ANY_VALUE),
        "op": draw(OPS | ANY_VALUE),
    }
    if draw(st.booleans()):
        message["body"] = draw(body | ANY_VALUE)
    if draw(st.integers(0, 4)) == 0:
        message["timeout_ms"] = draw(st.integers(0, 60_000) | ANY_VALUE)
    for key in draw(st.lists(KEYS, max_size=2)):   # unknown and non-string envelope keys
        message[key] = draw(SCALARS)
    for key in draw(st.lists(st.sampled_from(["v", "id", "op"]), max_size=1)):
        message.pop(key, None)
    return message


def pack_or_none(value):
    try:
        return pack(value)
    except (TypeError, ValueError, OverflowError):
        return None


@st.composite
def near_valid(draw):
    """A good decide request with exactly one envelope field replaced, added or removed."""
    message = {"v": 1, "id": draw(VALID_ID), "op": "decide", "body": draw(valid_body)}
    field = draw(st.sampled_from(["v", "id", "op", "body", "timeout_ms", "unknown", "missing"]))
    if field == "missing":
        message.pop(draw(st.sampled_from(["v", "id", "op", "body"])))
    elif field == "op":
        message["op"] = draw(OPS | ANY_VALUE)
    elif field == "v":
        message["v"] = draw(INT64 | ANY_VALUE)
    else:
        message[field] = draw(ANY_VALUE)
    return message


@st.composite
def duplicate_key_payload(draw):
    """A request map with one key written twice (msgpack allows it; dicts cannot hold it)."""
    pairs = list(draw(envelope()).items())
    key = draw(st.sampled_from([k for k, _ in pairs])) if pairs else "id"
    pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(SCALARS)))
    try:
        return msgpack.Packer(use_bin_type=True).pack_map_pairs(pairs)
    except (TypeError, ValueError, OverflowError):
        return None


def _truncations(payload: bytes) -> st.SearchStrategy:
    return st.integers(0, max(0, len(payload) - 1)).map(lambda cut: payload[:cut])


payload = st.one_of(
    st.binary(max_size=256),                                             # random bytes
    ANY_VALUE.map(pack_or_none),                                         # every msgpack type at the top
    envelope().map(pack_or_none),                                        # wrong types for v/id/op/body
    near_valid().map(pack_or_none),                                      # one thing wrong
    st.builds(lambda m: pack_or_none({"v": 1, "id": 1, "op": "decide", "body": m}), poisoned_body(WIRE_POISONS)),
    envelope().map(pack_or_none).filter(bool).flatmap(_truncations),     # truncated msgpack
    duplicate_key_payload(),
).filter(lambda p: p is not None)
