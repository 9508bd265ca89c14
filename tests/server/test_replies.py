"""Replies: counted, carrying the daemon's load where they answer a decide, and sent (no daemon)."""
from types import SimpleNamespace

import msgpack

from jevany_client.errors import InvalidRequestError, OverloadedError

from jevany_daemon.server.metrics import Metrics
from jevany_daemon.server.replies import Replies
from jevany_daemon.server.request_queue import Entry, RequestQueue
from jevany_daemon.server.status import Counters


class Sent:
    def __init__(self):
        self.replies = []

    def send(self, sock, envelope, payload):
        self.replies.append(msgpack.unpackb(payload))


class Gather:
    def __init__(self):
        self.answered_for = []

    def answered(self, client, now):
        self.answered_for.append(client)


def replies_with(queued: int = 0, inflight: int = 0):
    queue = RequestQueue(8)
    for tag in range(queued):
        queue.push(entry(tag))
    outbox, gather, counters = Sent(), Gather(), Counters()
    replies = Replies(counters=counters, metrics=Metrics(), outbox=outbox, queue=queue,
                      pool=SimpleNamespace(inflight=lambda: inflight), gather=gather, clock=lambda: 2.0,
                      settings=lambda: SimpleNamespace(log_requests=False), gateway=None)
    return replies, outbox, gather, counters


def entry(tag: int) -> Entry:
    return Entry(tag, sock=None, envelope=[b"c%d" % tag], id=f"r{tag}", payload=b"", received=1.5, deadline=None)


def test_a_refused_decide_carries_the_load_and_a_refused_status_does_not():
    replies, outbox, _, counters = replies_with(queued=3, inflight=2)
    replies.refuse(None, [b"c"], "decide", "a", OverloadedError("full"))
    replies.refuse(None, [b"c"], "status", "b", InvalidRequestError("no"))
    assert outbox.replies[0]["load"] == {"queue": 3, "inflight": 2}
    assert "load" not in outbox.replies[1]
    assert counters.by_code == {"overloaded": 1, "invalid_request": 1}


def test_an_error_reply_tells_the_gather_unless_it_heard_already():
    replies, outbox, gather, counters = replies_with()
    replies.reply_error(entry(1), InvalidRequestError("bad media"))
    replies.reply_error(entry(2), InvalidRequestError("bad media"), noted=True)
    assert gather.answered_for == [(id(None), b"c1")]
    assert [r["id"] for r in outbox.replies] == ["r1", "r2"]
    assert counters.latency_ms()["samples"] == 2 and counters.latency_ms()["p50"] == 500.0
