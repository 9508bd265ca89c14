"""End to end: many client processes, one daemon process, real ipc sockets."""
import multiprocessing as mp

import msgpack
import zmq

from jevany_daemon import workloads
from jevany_daemon.parity import answer_problems, compare

from .client_proc import stream

N_CLIENTS = 16
PER_CLIENT = 6


def test_concurrent_client_processes_get_their_own_answers(start_daemon, loaded_model):
    daemon = start_daemon("--max-batch-size", "8")
    bodies = workloads.short(N_CLIENTS * PER_CLIENT, seed=42)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=stream, args=(daemon.endpoint, bodies[k::N_CLIENTS][:PER_CLIENT], k * 100, queue))
             for k in range(N_CLIENTS)]
    for p in procs:
        p.start()
    got, echoed = {}, {}
    for _ in procs:
        for index, rid, result in queue.get(timeout=240):
            got[index], echoed[index] = result, rid
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(got) == N_CLIENTS * PER_CLIENT
    # map back: client k sent bodies[k::N_CLIENTS]
    order = [(k * 100 + i, bodies[k + i * N_CLIENTS]) for k in range(N_CLIENTS) for i in range(PER_CLIENT)]
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine

    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig())
    expected = [engine.decide(body) for _, body in order]
    # each reply echoed the id its own client process sent for that request
    assert all(echoed[index] == f"p{index - index % 100}-{index % 100}" for index, _ in order)
    report = compare(expected, [got[index] for index, _ in order])
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == []
    assert [p for index, body in order for p in answer_problems(body, got[index])] == []
    with daemon.client() as client:
        status = client.status()
    assert status["requests"]["ok"] >= N_CLIENTS * PER_CLIENT
    assert status["batching"]["requests"] == N_CLIENTS * PER_CLIENT
    # concurrent clients shared forward passes
    assert max(int(size) for size in status["batching"]["batch_size_histogram"]) > 1
    assert status["batching"]["batches"] < N_CLIENTS * PER_CLIENT
    assert daemon.stop() == 0


def test_every_reply_matches_its_id_when_pipelined(start_daemon):
    daemon = start_daemon("--max-batch-size", "8")
    bodies = workloads.mixed(40, seed=9, max_words=20)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.endpoint)
    for i, body in enumerate(bodies):
        sock.send(msgpack.packb({"v": 1, "id": i, "op": "decide", "body": body}))
    replies = {}
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while len(replies) < len(bodies) and poller.poll(120_000):
        reply = msgpack.unpackb(sock.recv())
        assert reply["id"] not in replies
        replies[reply["id"]] = reply
    sock.close()
    ctx.term()
    assert sorted(replies) == list(range(40))
    for i, body in enumerate(bodies):
        assert replies[i]["ok"], replies[i]
        assert answer_problems(body, replies[i]["result"]) == []
    daemon.stop()


def test_req_and_dealer_clients(start_daemon):
    daemon = start_daemon()
    ctx = zmq.Context()
    body = workloads.short(1, seed=1)[0]
    try:
        req = ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.setsockopt(zmq.RCVTIMEO, 60_000)
        req.connect(daemon.endpoint)
        req.send(msgpack.packb({"v": 1, "id": "r1", "op": "decide", "body": body}))
        via_req = msgpack.unpackb(req.recv())
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVTIMEO, 60_000)
        dealer.connect(daemon.endpoint)
        dealer.send(msgpack.packb({"v": 1, "id": "d1", "op": "decide", "body": body}))
        via_dealer = msgpack.unpackb(dealer.recv())
    finally:
        ctx.destroy(linger=0)
    assert via_req["id"] == "r1" and via_dealer["id"] == "d1"
    assert via_req["result"]["answers"] == via_dealer["result"]["answers"]
    daemon.stop()
