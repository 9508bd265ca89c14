"""Client operations as the loop hands them over: decoded, allowed or refused, queued (no daemon)."""
from types import SimpleNamespace

import pytest

from jevany_client.errors import InvalidMessageError
from jevany_client.protocol import encode_request

from jevany_daemon.server.client_ops import CHECKED_WHOLE_BYTES, ClientOps, decoded
from jevany_daemon.server.request_queue import RequestQueue
from jevany_daemon.server.run_state import RunState

DECIDE = {"state": "x", "questions": {"q": {"type": "noul"}}}


def ping_of(size: int) -> bytes:
    """A ping of exactly size bytes, padded in its body."""
    pad = size - len(encode_request("p", "ping", {"pad": ""}))
    payload = encode_request("p", "ping", {"pad": "a" * pad})
    # msgpack's string header grows at 32 and 256 bytes: take back what it added.
    payload = encode_request("p", "ping", {"pad": "a" * (pad - (len(payload) - size))})
    assert len(payload) == size
    return payload


def test_a_message_of_exactly_the_checked_size_is_decoded_whole_and_one_byte_more_is_not():
    assert decoded(ping_of(CHECKED_WHOLE_BYTES)).op == "ping"
    with pytest.raises(InvalidMessageError, match="at most"):
        decoded(ping_of(CHECKED_WHOLE_BYTES + 1))


class Replies:
    def __init__(self):
        self.refused = []

    def refuse(self, sock, envelope, op, rid, err):
        self.refused.append((rid, err.code))

    def transport(self, sock):
        return "zmq"


def ops_with(queue, run_state, checking: int = 0):
    replies = Replies()
    media = SimpleNamespace(pending=lambda: checking) if checking else None
    ops = ClientOps(clock=lambda: 5.0, run_state=run_state, queue=queue, media=media,
                    gather=SimpleNamespace(arrived=lambda client, at: None),
                    overloads=SimpleNamespace(hit=lambda **why: None), pool=None, clears=None, reloads=None,
                    control=None, replies=replies, status=None, begin_drain=None)
    return ops, replies


def test_requests_being_checked_for_media_count_against_the_queue_bound():
    queue, run_state = RequestQueue(max_depth=2), RunState(0.0)
    run_state.ready()
    ops, replies = ops_with(queue, run_state, checking=1)
    ops.handle(None, [b"c"], encode_request("a", "decide", DECIDE))
    assert len(queue) == 1 and replies.refused == []
    ops.handle(None, [b"c"], encode_request("b", "decide", DECIDE))
    assert len(queue) == 1 and replies.refused == [("b", "overloaded")]


def test_a_request_that_came_while_the_model_loaded_is_marked_so_and_its_deadline_kept_in_seconds():
    queue, run_state = RequestQueue(max_depth=4), RunState(0.0)
    ops, _ = ops_with(queue, run_state)
    ops.handle(None, [b"c"], encode_request("a", "decide", DECIDE, timeout_ms=1500))
    run_state.ready()
    ops.handle(None, [b"c"], encode_request("b", "decide", DECIDE))
    assert [(e.id, e.before_ready, e.deadline) for e in queue] == [("a", True, 6.5), ("b", False, None)]
