"""Client processes for the concurrency tests (imported by spawned interpreters)."""
import multiprocessing as mp

import msgpack
import zmq

from jevany_client import JevClient, JevanyError

REPLY_WITHIN_S = 120


def stream(endpoint: str, bodies: list, start: int, queue, barrier=None) -> None:
    """Send requests one after another on a bare DEALER; report (index, id echoed, result) for each.

    The ids are this process's own ("p{start}-{i}"), so the id each reply
    echoes shows whether it answers the request just sent. With a barrier,
    the first request waits until every party is connected and ready. An
    error reply ends the stream with an AssertionError (exit code 1), after
    reporting what came before it.
    """
    out = []
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        if barrier is not None:
            assert _exchange(sock, {"v": 1, "id": f"p{start}-ping", "op": "ping"})["ok"]
            barrier.wait(120)
        for i, body in enumerate(bodies):
            rid = f"p{start}-{i}"
            reply = _exchange(sock, {"v": 1, "id": rid, "op": "decide", "body": body})
            assert reply["ok"], f"{rid}: {reply.get('error')}"
            out.append((start + i, reply["id"], reply["result"]))
    finally:
        queue.put(out)
        ctx.destroy(linger=0)


def streamed(endpoint: str, bodies: list, clients: int) -> dict:
    """bodies[k::clients] from client process k, each streamed; {k * 100 + i: its i-th result}."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=stream, args=(endpoint, bodies[k::clients], k * 100, queue)) for k in range(clients)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        for index, _rid, result in queue.get(timeout=240):
            got[index] = result
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return got


def _exchange(sock, message: dict) -> dict:
    sock.send(msgpack.packb(message))
    assert sock.poll(REPLY_WITHIN_S * 1000), f"no reply to {message['id']} within {REPLY_WITHIN_S}s"
    return msgpack.unpackb(sock.recv())


def outcome(result) -> str:
    return result.code if isinstance(result, JevanyError) else "ok"


def pipelined(endpoint: str, bodies: list, name: str, queue) -> None:
    """Send every body at once (no retries, so each reply is what the daemon said); report outcome codes."""
    with JevClient(endpoint, timeout=120, retries=0) as client:
        results = client.decide_many(bodies, return_exceptions=True)
    queue.put((name, [outcome(r) for r in results]))


def until_stopped(endpoint: str, bodies: list, name: str, stop, queue, pause_s: float = 0.0) -> None:
    """Send bodies in turn, one at a time, until stop is set; report (outcome, model) per request.

    pause_s paces the stream (load shaping, so a 2-core machine has room left to load a model).
    """
    seen = []
    with JevClient(endpoint, timeout=120, retries=0) as client:
        i = 0
        while not stop.wait(pause_s) or len(seen) < 2:
            try:
                result = client.call("decide", bodies[i % len(bodies)])
                seen.append(("ok", result["model"]))
            except JevanyError as err:
                seen.append((err.code, err.message))
            i += 1
    queue.put((name, seen))
