"""The bulk route against ZeroMQ's decide_stream: 10,000 items from one call, 32 in flight, one daemon.

One daemon (max_batch_size 32, the default choice readout on the tiny qwen3
model, --http on loopback) serves both, one after the other, the same
bodies (workloads.short):

- bulk: one POST /v1/systemone/bulk?in_flight=32 with every item as a JSON
  line, the body written from a thread through a 64 kB send buffer while the
  answers are read: items/s, seconds to the first answer and how many lines
  had been written by then, every index answered once, the gateway's RSS
  before, at its peak (sampled every 500 answers) and after;
- zmq: AsyncJevClient.decide_stream(in_flight=32) over the same bodies:
  items/s and every index answered once.

    .venv/bin/python benchmarks/bulk_bench.py [--items N] [--out PATH]

Writes benchmarks/results/cpu-bulk.json.
"""
import argparse
import asyncio
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Daemon, free_port, machine, rss_kb, write_result   # noqa: E402

from jevany_client import AsyncJevClient   # noqa: E402
from jevany_daemon import workloads   # noqa: E402
from jevany_daemon.model.tiny import build_tiny_model   # noqa: E402

SAMPLE_EVERY = 500


def bulk(port: int, bodies: list, in_flight: int, gateway: int) -> dict:
    sock = socket.create_connection(("127.0.0.1", port), timeout=600)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
    sock.sendall(f"POST /v1/systemone/bulk?in_flight={in_flight} HTTP/1.1\r\nHost: bench\r\n"
                 "Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    written = [0]

    def write():
        for body in bodies:
            line = json.dumps(body).encode() + b"\n"
            sock.sendall(b"%x\r\n%s\r\n" % (len(line), line))
            written[0] += 1
        sock.sendall(b"0\r\n\r\n")

    before = rss_kb(gateway)
    started = time.perf_counter()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    reply = sock.makefile("rb")
    assert b" 200 " in reply.readline()
    while reply.readline() not in (b"\r\n", b""):
        pass
    seen, first, peak, closing, pending = set(), None, before, None, b""
    while closing is None:
        size = int(reply.readline().strip() or b"0", 16)
        if size == 0:
            break
        pending += reply.read(size)
        reply.readline()
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = json.loads(raw)
            if "done" in line:
                closing = line
                continue
            if first is None:
                first = (time.perf_counter() - started, written[0])
            assert "answer" in line and line["index"] not in seen, line
            seen.add(line["index"])
            if len(seen) % SAMPLE_EVERY == 0:
                peak = max(peak, rss_kb(gateway))
    took = time.perf_counter() - started
    writer.join(60)
    sock.close()
    return {"items": len(bodies), "in_flight": in_flight, "seconds": round(took, 2),
            "items_per_s": round(len(bodies) / took, 1), "first_answer_s": round(first[0], 3),
            "lines_written_at_first_answer": first[1], "every_item_once": seen == set(range(len(bodies))),
            "closing_line": closing, "gateway_rss_mb": {"before": round(before / 1024, 1),
                                                        "peak": round(peak / 1024, 1),
                                                        "after": round(rss_kb(gateway) / 1024, 1)}}


def over_zmq(endpoint: str, bodies: list, in_flight: int) -> dict:
    async def run():
        got = {}
        async with AsyncJevClient(endpoint, timeout=600) as client:
            started = time.perf_counter()
            async for index, outcome in client.decide_stream(bodies, in_flight=in_flight):
                got[index] = outcome
            return got, time.perf_counter() - started

    got, took = asyncio.run(run())
    failed = sum(1 for outcome in got.values() if not isinstance(outcome, dict))
    return {"items": len(bodies), "in_flight": in_flight, "seconds": round(took, 2),
            "items_per_s": round(len(bodies) / took, 1), "every_item_once": sorted(got) == list(range(len(bodies))),
            "failed": failed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--items", type=int, default=10_000)
    p.add_argument("--in-flight", type=int, default=32)
    p.add_argument("--out", type=Path, default=HERE / "results" / "cpu-bulk.json")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="jv-bulk-"))
    model = build_tiny_model(root / "qwen3-choice", arch="qwen3", readout="choice", seed=0)
    port = free_port()
    settings = argparse.Namespace(device="cpu", dtype="fp32", serve_args=["--http", f"127.0.0.1:{port}"])
    daemon = Daemon(model, settings, batch=32, policy="adaptive")
    try:
        gateway = daemon.client.status()["http"]["pid"]
        bodies = workloads.short(args.items, seed=11)
        result = {"bulk": bulk(port, bodies, args.in_flight, gateway),
                  "zmq": over_zmq(daemon.endpoint, bodies, args.in_flight)}
    finally:
        daemon.stop()
    result["machine"] = machine(model="tiny qwen3, choice readout", max_batch_size=32)
    print(json.dumps(result, indent=2))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
