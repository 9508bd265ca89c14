"""Client operations as the loop hands them over: decoded, allowed or refused, queued (no daemon)."""
import os
from types import SimpleNamespace

import pytest

from jevany_client.errors import InvalidMessageError
from jevany_client.protocol import encode_request

from jevany_daemon import withdrawals
from jevany_daemon.server.client_ops import CHECKED_WHOLE_BYTES, ClientOps, decoded
from jevany_daemon.server.outbox import Envelope
from jevany_daemon.server.peers import Peer, may_control
from jevany_daemon.server.request_queue import RequestQueue
from jevany_daemon.server.run_state import RunState
from jevany_daemon.server.status import prefix_cache

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


GATEWAY = "the gateway's socket"


class Replies:
    def __init__(self):
        self.refused, self.answered, self.departed_ids, self.late = [], [], [], 0

    def refuse(self, sock, envelope, op, rid, err):
        self.refused.append((rid, err.code))

    def answer(self, sock, envelope, op, rid, result):
        self.answered.append((sock, op, result))

    def transport(self, sock):
        return "http" if sock is GATEWAY else "zmq"

    def departed(self, entry):
        self.departed_ids.append((entry.envelope[0], entry.id))

    def withdrawn_late(self):
        self.late += 1


def ops_with(queue, run_state, checking: int = 0, control=None, status=None):
    replies = Replies()
    media = SimpleNamespace(pending=lambda: checking) if checking else None
    ops = ClientOps(clock=lambda: 5.0, run_state=run_state, queue=queue, media=media,
                    gather=SimpleNamespace(arrived=lambda client, at: None),
                    overloads=SimpleNamespace(hit=lambda **why: None), pool=None, clears=None, reloads=None,
                    control=control, replies=replies, status=status, begin_drain=None)
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


CONTROL, PUBLIC = "the control socket", "a public socket"


def test_the_cache_counters_reach_only_the_control_socket_even_for_the_daemons_own_user():
    # public_cache_counters off: a status or models op on a public socket gets the cache's setup alone,
    # whoever sends it; the daemon's own user (who may send control ops) sees the counters only on the
    # control socket, where another user (a control socket opened to everyone) does not.
    worker = SimpleNamespace(stats={"prefix_cache": {"enabled": True, "size": 2, "hits": 5, "misses": 1}})
    pool = SimpleNamespace(serving=lambda: [worker])
    engine = SimpleNamespace(prefix_cache=64, prefix_cache_bytes=1 << 20, prefix_min_tokens=8)
    settings = SimpleNamespace(engine=engine, public_cache_counters=False)
    status = SimpleNamespace(status=lambda private: {"prefix_cache": prefix_cache(pool, settings, private)},
                             model=lambda private: {"prefix_cache": prefix_cache(pool, settings, private)})
    run_state = RunState(0.0)
    run_state.ready()
    ops, replies = ops_with(RequestQueue(max_depth=2), run_state, control=CONTROL, status=status)
    own_user = Envelope.of([b"c"], Peer(fd=7, serial=1, uid=os.getuid()))
    other_user = Envelope.of([b"o"], Peer(fd=8, serial=1, uid=os.getuid() + 1))
    assert may_control(own_user) and not may_control(other_user)
    for sock, envelope in ((PUBLIC, own_user), (CONTROL, own_user), (CONTROL, other_user)):
        ops.handle(sock, envelope, encode_request("s", "status"))
        ops.handle(sock, envelope, encode_request("m", "models"))
    caches = [result["prefix_cache"] if op == "status" else result["models"][0]["prefix_cache"]
              for _, op, result in replies.answered]
    assert [(sock, op) for sock, op, _ in replies.answered] == [
        (sock, op) for sock in (PUBLIC, CONTROL, CONTROL) for op in ("status", "models")]
    assert [cache.get("hits") for cache in caches] == [None, None, 5, 5, None, None]
    assert all(cache["enabled"] and cache["max_entries"] == 64 for cache in caches) and replies.refused == []


def test_a_withdrawal_takes_out_only_its_own_gateway_connections_request_and_one_too_late_is_counted():
    queue, run_state = RequestQueue(max_depth=8), RunState(0.0)
    run_state.ready()
    ops, replies = ops_with(queue, run_state)
    ops.handle(GATEWAY, [b"old-gateway"], encode_request(7, "decide", DECIDE))   # a gateway since restarted
    ops.handle(None, [b"zmq-client"], encode_request(7, "decide", DECIDE))
    ops.handle(GATEWAY, [b"gateway"], encode_request(6, "decide", DECIDE))
    ops.handle(GATEWAY, [b"gateway"], encode_request(7, "decide", DECIDE, timeout_ms=100))
    ops.handle(GATEWAY, [b"gateway"], withdrawals.encode(7))
    assert replies.departed_ids == [(b"gateway", 7)] and replies.late == 0
    assert [(e.envelope[0], e.id) for e in queue] == [(b"old-gateway", 7), (b"zmq-client", 7), (b"gateway", 6)]
    assert queue.next_deadline() is None         # the withdrawn one's deadline left with it
    ops.handle(GATEWAY, [b"gateway"], withdrawals.encode(7))       # in a pass by now, or answered
    assert replies.late == 1 and len(queue) == 3 and replies.refused == []


def test_a_withdrawal_from_a_zeromq_client_is_an_unreadable_message_and_takes_nothing():
    queue, run_state = RequestQueue(max_depth=8), RunState(0.0)
    run_state.ready()
    ops, replies = ops_with(queue, run_state)
    ops.handle(None, [b"c"], encode_request(3, "decide", DECIDE))
    ops.handle(None, [b"c"], withdrawals.encode(3))
    assert len(queue) == 1 and replies.departed_ids == [] and replies.refused == [(None, "invalid_message")]


@pytest.mark.parametrize("payload", [withdrawals.MARK, withdrawals.MARK + b"\xc3", withdrawals.MARK + b"\xa1x",
                                     withdrawals.MARK + b"\x01\x02", encode_request(3, "ping")])
def test_only_a_mark_then_one_integer_is_a_withdrawal(payload):
    assert withdrawals.decode(payload) is None
    assert withdrawals.decode(withdrawals.encode(2**40)) == 2**40
