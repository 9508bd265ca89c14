"""One client process keeping N requests in flight: what a load costs when it is not 32 processes.

sim_bench.py runs it beside its 32 client processes, on the same daemon, to
tell the daemon's own host time apart from its clients' CPU (all of them
share this machine's cores, which on a GPU host they do not):

    python benchmarks/inflight_load.py ENDPOINT BODIES.json N runner
        one AsyncJevClient, N requests in flight: how the eval runner sends
    python benchmarks/inflight_load.py ENDPOINT BODIES.json N bare
        one DEALER socket, every request encoded before the clock starts,
        each reply only decoded and checked ok: the least a client can cost,
        so what is left is the daemon's

Once connected it prints "ready" and waits for a line on stdin (go), so the
caller measures the daemon over the load alone; then it prints one JSON line,
requests a second and the cores' worth of CPU this process used meanwhile,
and waits for another line before it closes anything: processes that finish
first must not spend the CPU of their exit while the others still run. jevany-client and pyzmq only, no torch, like the
fleet it stands for. Any reply that is not ok fails the run: a benchmark
that counted errors as answers would measure nothing.
"""
import asyncio
import json
import sys
import time

import msgpack
import zmq

from jevany_client.async_client import AsyncJevClient
from jevany_client.protocol import encode_request


async def runner(endpoint: str, bodies: list, inflight: int) -> None:
    async with AsyncJevClient(endpoint, timeout=600, retries=0) as client:
        await client.ping()                  # connected before the clock starts
        go()
        todo = iter(bodies)

        async def one_slot():
            for body in todo:                # shared: each slot takes the next body when its last is answered
                await client.call("decide", body)

        started = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one_slot() for _ in range(inflight)))
        done(started, len(bodies))


def bare(endpoint: str, bodies: list, inflight: int) -> None:
    payloads = [encode_request(i, "decide", body) for i, body in enumerate(bodies)]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(encode_request("ping", "ping"))
    sock.recv()                              # connected before the clock starts
    go()
    started = time.perf_counter(), time.process_time()
    sent = min(inflight, len(payloads))
    for payload in payloads[:sent]:
        sock.send(payload)
    for _ in payloads:
        reply = msgpack.unpackb(sock.recv())
        if reply.get("ok") is not True:
            raise RuntimeError(f"request {reply.get('id')!r} failed: {reply.get('error')}")
        if sent < len(payloads):
            sock.send(payloads[sent])
            sent += 1
    done(started, len(bodies))
    sock.close(linger=0)


def go() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def done(started: tuple[float, float], n: int) -> None:
    elapsed = time.perf_counter() - started[0]
    print(json.dumps({"rps": n / elapsed, "cores": (time.process_time() - started[1]) / elapsed}), flush=True)
    sys.stdin.readline()


def main(argv: list[str]) -> None:
    endpoint, path, inflight, kind = argv[0], argv[1], int(argv[2]), argv[3]
    with open(path) as f:
        bodies = json.load(f)
    if kind not in ("runner", "bare"):
        raise SystemExit(f"kind must be runner or bare, not {kind!r}")
    if kind == "runner":
        asyncio.run(runner(endpoint, bodies, inflight))
    else:
        bare(endpoint, bodies, inflight)


if __name__ == "__main__":
    main(sys.argv[1:])
