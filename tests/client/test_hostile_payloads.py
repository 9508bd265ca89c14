"""Hostile input on the client library's side (issue 24): decode costs follow a message's bytes and its
counts are capped."""
import time
import tracemalloc

import msgpack
import pytest

from jevany_client.errors import InvalidRequestError
from jevany_client.protocol import MAX_CONTAINERS, MAX_VALUES, decode_request

QUESTIONS = {"q": {"type": "noul"}}


def message(state, rid="r1") -> bytes:
    return msgpack.packb({"v": 1, "id": rid, "op": "decide", "body": {"state": state, "questions": QUESTIONS}})


def test_eight_million_empty_maps_are_refused_fast_with_the_id_and_little_memory():
    payload = message([{}] * 8_000_000)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InvalidRequestError) as err:
            decode_request(payload)
        took, peak = time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Before: decoded whole, 8 million dicts (1.6 GB, about 3 s), then walked (3.5 s more).
    assert err.value.request_id == "r1" and "more than 1,048,576 values or 65,536 maps" in err.value.message
    assert took < 5.0 and peak < 64 << 20, (took, peak)


def test_the_caps_are_exact():
    # The message itself holds five containers: the envelope, body, questions, q, and the state array.
    assert decode_request(message([{}] * (MAX_CONTAINERS - 5))).body["state"][-1] == {}
    with pytest.raises(InvalidRequestError):
        decode_request(message([{}] * (MAX_CONTAINERS - 4)))
    # values: the state's items, plus the rest's pairs (4 envelope, 2 body, 1 questions, 1 q)
    assert len(decode_request(message([0] * (MAX_VALUES - 8))).body["state"]) == MAX_VALUES - 8
    with pytest.raises(InvalidRequestError):
        decode_request(message([0] * (MAX_VALUES - 7)))


def test_an_id_is_still_echoed_when_it_comes_after_the_bomb():
    body = {"state": [{}] * 100_000, "questions": QUESTIONS}
    payload = msgpack.Packer().pack_map_pairs([("v", 1), ("op", "decide"), ("body", body), ("id", "late")])
    with pytest.raises(InvalidRequestError) as err:
        decode_request(payload)
    assert err.value.request_id == "late"
