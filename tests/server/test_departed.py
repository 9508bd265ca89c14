"""No work for the departed: a queued decide request whose ZeroMQ client has disconnected is dropped
before it is scored (supervisor.take_live), as is one whose HTTP caller closed its connection (the
gateway withdraws it), counted in status and metrics; a live client's never is.

Real daemon, real sockets: the worker is frozen (SIGSTOP) so requests stay queued while a client
leaves, then resumed.
"""
import json
import socket
import urllib.request
from types import SimpleNamespace

import msgpack
import zmq

from jevany_daemon.server.outbox import Envelope
from jevany_daemon.server.peers import Peer
from jevany_daemon.server.request_queue import Entry
from jevany_daemon.server.supervisor import Supervisor

from .daemons import wait_for
from .http_proc import free_port, healthy
from .shared_daemons import Raw, frozen, serving_worker

TEXT = {"state": {"ticket": "parcel lost"}, "questions": {"u": {"type": "noul"}}}


def _held(daemon) -> int:
    status = daemon.status()
    return status["workers"][0]["inflight"] + status["queue"]["depth"]


def test_a_departed_clients_queued_requests_are_dropped_unscored_and_a_live_clients_are_answered(start_daemon):
    # One pass holds 32: a busy worker takes nothing ahead, so what comes while it is frozen stays queued.
    daemon = start_daemon("--max-batch-size", "32", "--heartbeat-timeout", "300", "--metrics-port", "0",
                          readout="choice")
    worker = serving_worker(daemon)
    with Raw(daemon.endpoint) as live:
        with frozen(worker["pid"]):
            live.send("live-0", "decide", TEXT)
            wait_for(lambda: _held(daemon) == 1, 30, "the live client's first request at the worker")
            gone_before = daemon.status()["clients"]["gone"]
            with Raw(daemon.endpoint) as leaving:
                for i in range(5):
                    leaving.send(f"left-{i}", "decide", TEXT)
                wait_for(lambda: _held(daemon) == 6, 30, "the leaving client's requests queued")
            wait_for(lambda: daemon.status()["clients"]["gone"] > gone_before, 30, "its departure seen")
            live.send("live-1", "decide", TEXT)
            wait_for(lambda: _held(daemon) == 7, 30, "the live client's second request queued")
        answered = sorted(live.recv(60)["id"] for _ in range(2))
        assert answered == ["live-0", "live-1"]
        wait_for(lambda: _held(daemon) == 0, 30, "nothing left in hand")
    status = daemon.status()
    assert status["requests"]["departed"] == 5
    assert status["requests"]["by_op"]["decide"] == 2          # no reply for the departed: no outcome either
    assert status["batching"]["requests"] == 2, "the worker scored a departed client's request"
    metrics = urllib.request.urlopen(status["metrics"], timeout=30).read().decode()
    assert "jevany_requests_departed_total 5.0" in metrics


def test_clients_that_send_and_close_at_once_have_their_requests_dropped_unscored(start_daemon):
    # Each leaves as soon as its request is written: its departure is often read with its message, before
    # the request is queued, and must count as much as one read later.
    daemon = start_daemon("--max-batch-size", "32", "--heartbeat-timeout", "300", readout="choice")
    worker = serving_worker(daemon)
    ctx = zmq.Context()
    try:
        with Raw(daemon.endpoint) as live:
            with frozen(worker["pid"]):
                live.send("live-0", "decide", TEXT)
                wait_for(lambda: _held(daemon) == 1, 30, "the live client's request at the worker")
                for i in range(20):
                    sock = ctx.socket(zmq.DEALER)
                    sock.setsockopt(zmq.LINGER, 5000)       # closed once the request is written, no later
                    sock.connect(daemon.endpoint)
                    sock.send(msgpack.packb({"v": 1, "id": f"left-{i}", "op": "decide", "body": TEXT}))
                    sock.close()
                wait_for(lambda: daemon.status()["requests"]["departed"] + _held(daemon) == 21, 30,
                         "the twenty read, queued or dropped")
                live.send("live-1", "decide", TEXT)
                wait_for(lambda: daemon.status()["requests"]["departed"] + _held(daemon) == 22, 30, "the last queued")
            assert sorted(live.recv(60)["id"] for _ in range(2)) == ["live-0", "live-1"]
    finally:
        ctx.term()
    wait_for(lambda: _held(daemon) == 0, 30, "nothing left in hand")
    status = daemon.status()
    assert status["requests"]["departed"] == 20 and status["batching"]["requests"] == 2
    assert status["clients"]["replies_dropped"].get("client gone", 0) == 0


def test_requests_of_a_client_that_stays_are_never_dropped_however_long_they_queue(start_daemon):
    daemon = start_daemon("--max-batch-size", "32", "--heartbeat-timeout", "300", readout="choice")
    worker = serving_worker(daemon)
    with Raw(daemon.endpoint) as stays, Raw(daemon.endpoint) as other:
        with frozen(worker["pid"]):
            stays.send("first", "decide", TEXT)
            wait_for(lambda: _held(daemon) == 1, 30, "the first request at the worker")
            for i in range(6):
                stays.send(f"queued-{i}", "decide", TEXT)
            other.send("other", "decide", TEXT)
            wait_for(lambda: _held(daemon) == 8, 30, "every request queued")
        answered = sorted(stays.recv(60)["id"] for _ in range(7))
        assert answered == sorted(["first"] + [f"queued-{i}" for i in range(6)])
        assert other.recv(60)["id"] == "other"
    status = daemon.status()
    assert status["requests"]["departed"] == 0 and status["batching"]["requests"] == 8


def test_a_pass_is_filled_from_behind_departed_requests_and_none_of_them_is_handed_over():
    handed, departed = [], []
    worker = SimpleNamespace(available=True, can_prefetch=True,
                             hand_over=lambda backend, entries, now: handed.append([e.id for e in entries]))
    settings = SimpleNamespace(max_queue=100, engine=SimpleNamespace(max_batch_size=3))
    sup = Supervisor(settings, clock=lambda: 10.0, env={})
    gone = {2, 5}          # the serials of connections that have left
    sup.wiring = SimpleNamespace(pool=SimpleNamespace(serving=lambda: [worker]), backend=object(),
                                 peers=SimpleNamespace(read=lambda: None, alive=lambda p: p.serial not in gone))
    sup.replies = SimpleNamespace(departed=lambda entry: departed.append(entry.id))
    for serial in (1, 2, 3, 4, 5, 6, 7):
        envelope = Envelope.of([b"c%d" % serial], Peer(fd=10 + serial, serial=serial))
        sup.queue.push(Entry(serial, None, envelope, serial, b"", 9.0, None))
    sup.queue.push(Entry(8, None, [b"gateway"], 8, b"", 9.0, None))     # no peer known: counts as live
    sup.dispatch()
    assert handed == [[1, 3, 4]] and departed == [2]          # one more taken for the one dropped, no more
    sup.dispatch()
    assert handed[1] == [6, 7, 8] and departed == [2, 5] and len(sup.queue) == 0


# --- HTTP callers: the gateway withdraws the request of a caller who closed its connection ---------

BODY = json.dumps({"state": "parcel lost", "questions": {"u": {"type": "noul"}}}).encode()


def _post(port: int) -> socket.socket:
    """A raw HTTP request on a connection of its own, its answer not read."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
    return conn


def _status_of(conn: socket.socket) -> int:
    return int(conn.makefile("rb").readline().split()[1])


def test_an_http_caller_who_closes_has_its_queued_request_dropped_and_the_live_callers_are_answered(
        start_daemon):
    port = free_port()
    daemon = start_daemon("--http", f"127.0.0.1:{port}", "--max-batch-size", "32", "--heartbeat-timeout", "300",
                          "--metrics-port", "0", readout="choice")
    wait_for(lambda: healthy(port), 60, "the gateway answering /health")
    worker = serving_worker(daemon)
    with frozen(worker["pid"]):
        first = _post(port)
        wait_for(lambda: _held(daemon) == 1, 30, "the live caller's first request at the worker")
        leaving = [_post(port) for _ in range(5)]
        wait_for(lambda: _held(daemon) == 6, 30, "the leaving callers' requests queued")
        for conn in leaving:
            conn.close()
        wait_for(lambda: daemon.status()["requests"]["departed"] == 5, 30, "the five withdrawn")
        assert _held(daemon) == 1
        second = _post(port)
        wait_for(lambda: _held(daemon) == 2, 30, "the live caller's second request queued")
    assert _status_of(first) == 200 and _status_of(second) == 200
    first.close(), second.close()
    status = daemon.status()
    assert status["requests"]["departed"] == 5 and status["requests"]["withdrawn_late"] == 0
    assert status["batching"]["requests"] == 2, "the worker scored a departed caller's request"
    metrics = urllib.request.urlopen(status["metrics"], timeout=30).read().decode()
    assert "jevany_requests_departed_total 5.0" in metrics


def test_an_http_caller_who_closes_once_a_worker_holds_its_request_has_it_scored_and_counted(start_daemon):
    port = free_port()
    daemon = start_daemon("--http", f"127.0.0.1:{port}", "--max-batch-size", "32", "--heartbeat-timeout", "300",
                          readout="choice")
    wait_for(lambda: healthy(port), 60, "the gateway answering /health")
    worker = serving_worker(daemon)
    with frozen(worker["pid"]):
        conn = _post(port)
        wait_for(lambda: _held(daemon) == 1, 30, "the request at the worker")
        conn.close()
        wait_for(lambda: daemon.status()["requests"]["withdrawn_late"] == 1, 30, "the late withdrawal")
    wait_for(lambda: _held(daemon) == 0, 30, "the request scored")
    status = daemon.status()
    assert status["requests"]["departed"] == 0 and status["batching"]["requests"] == 1
    assert _status_of(_post(port)) == 200, "the gateway serves on after an answer nobody waited for"
