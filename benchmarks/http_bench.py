"""HTTP through the gateway vs ZeroMQ, against one daemon, in one run.

One daemon (max_batch_size 32, the default choice readout on the tiny qwen3
model) serves both; the same client processes talk ZeroMQ to it or HTTP to
its gateway, in alternating rounds, so both see the same machine:

- idle latency: one client, one request at a time, alternating ZeroMQ and
  HTTP request by request (so drift on a noisy machine hits both alike);
  p50 of each, and the median of the paired differences;
- throughput: 32 closed-loop clients in alternating rounds, requests per
  second of each (the median over rounds).

Targets: HTTP p50 <= ZeroMQ p50 + 1 ms; HTTP throughput >= 0.9x ZeroMQ's.

    .venv/bin/python benchmarks/http_bench.py [--quick] [--out PATH]
"""
import argparse
import http.client as http_client
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import ClientPool, Daemon, free_port, machine, median, percentile, write_result   # noqa: E402

from jevany_client import JevClient   # noqa: E402
from jevany_daemon import workloads   # noqa: E402
from jevany_daemon.model.tiny import build_tiny_model   # noqa: E402


def rounds(pool, daemon, http, bodies, concurrency, n_rounds) -> dict:
    """Alternate which transport goes first; per-round figures and their medians."""
    out = {"zmq": [], "http": []}
    for r in range(n_rounds):
        order = ("zmq", "http") if r % 2 == 0 else ("http", "zmq")
        for transport in order:
            run = pool.run(daemon, bodies, concurrency, endpoint=http if transport == "http" else None)
            out[transport].append({"rps": run["rps"], "p50_ms": percentile(run["latencies"], 0.5) * 1000,
                                   "p99_ms": percentile(run["latencies"], 0.99) * 1000,
                                   "mean_batch_size": run["mean_batch_size"],
                                   "supervisor_cores": run["supervisor_cores"]})
    summary = {t: {k: median([x[k] for x in runs]) for k in ("rps", "p50_ms", "p99_ms", "mean_batch_size")}
               for t, runs in out.items()}
    return {"rounds": out, **summary}


def idle_pairs(daemon, http: str, bodies: list) -> dict:
    """Each body twice, once per transport, the order alternating; latencies in ms."""
    host, port = http.removeprefix("http://").rsplit(":", 1)
    session = http_client.HTTPConnection(host, int(port), timeout=600)
    session.connect()
    session.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # as requests (urllib3) does

    def over_http(body):
        session.request("POST", "/v1/systemone", body=json.dumps(body), headers={"Content-Type": "application/json"})
        reply = session.getresponse()
        payload = reply.read()
        assert reply.status == 200, payload[:200]
        return json.loads(payload)

    out = {"zmq": [], "http": []}
    with JevClient(daemon.endpoint, timeout=600, retries=0) as client:
        for i, body in enumerate(bodies):
            for transport in (("zmq", "http") if i % 2 else ("http", "zmq")):
                started = time.perf_counter()
                client.call("decide", body) if transport == "zmq" else over_http(body)
                out[transport].append((time.perf_counter() - started) * 1000)
    session.close()
    paired = [h - z for h, z in zip(out["http"], out["zmq"])]
    return {"requests": len(bodies), "zmq": {"p50_ms": median(out["zmq"]), "p99_ms": percentile(out["zmq"], 0.99)},
            "http": {"p50_ms": median(out["http"]), "p99_ms": percentile(out["http"], 0.99)},
            "paired_difference_p50_ms": median(paired)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer requests and rounds (about 2 minutes)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--out", type=Path, default=HERE / "results" / "cpu-fp32-tiny-http.json")
    args = p.parse_args()
    idle_n, load_n, n_rounds = (100, 256, 2) if args.quick else (400, 768, 4)

    root = Path(tempfile.mkdtemp(prefix="jv-http-bench-"))
    model = build_tiny_model(root / "qwen3-choice", arch="qwen3", readout="choice", seed=0)
    port = free_port()
    http = f"http://127.0.0.1:{port}"
    settings = argparse.Namespace(device="cpu", dtype="fp32", serve_args=["--http", f"127.0.0.1:{port}"])
    daemon = Daemon(model, settings, batch=32, policy="adaptive")
    pool = ClientPool(args.clients)
    try:
        pool.run(daemon, workloads.short(64, seed=1), 8, endpoint=http)     # warm both paths
        pool.run(daemon, workloads.short(64, seed=1), 8)
        idle = idle_pairs(daemon, http, workloads.short(idle_n, seed=2))
        load = rounds(pool, daemon, http, workloads.short(load_n, seed=3), args.clients, n_rounds)
        status = daemon.client.status()
    finally:
        pool.close()
        daemon.stop()
    added_ms = idle["paired_difference_p50_ms"]
    ratio = load["http"]["rps"] / load["zmq"]["rps"]
    result = {
        "machine": machine(),
        "settings": {"model": "tiny qwen3, choice readout, fp32, cpu", "max_batch_size": 32,
                     "clients": args.clients, "idle_requests": idle_n, "load_requests": load_n,
                     "rounds": n_rounds, "quick": args.quick},
        "idle": idle, "load": load,
        "http_added_p50_ms": added_ms, "http_throughput_ratio": ratio,
        "mixed_transport_batches": status["batching"]["mixed_transport_batches"],
        "decide_by_transport": status["requests"]["decide_by_transport"],
        "targets": {"http_p50_within_1ms": added_ms <= 1.0, "http_throughput_at_least_0.9x": ratio >= 0.9},
    }
    print(f"idle p50: zmq {idle['zmq']['p50_ms']:.2f} ms, http {idle['http']['p50_ms']:.2f} ms; paired "
          f"difference {added_ms:+.2f} ms (target <= +1 ms: {'met' if added_ms <= 1.0 else 'NOT met'})")
    print(f"{args.clients} clients: zmq {load['zmq']['rps']:.1f} req/s, http {load['http']['rps']:.1f} req/s "
          f"({ratio:.2f}x; target >= 0.9x: {'met' if ratio >= 0.9 else 'NOT met'})")
    write_result(result, args.out)


if __name__ == "__main__":
    main()
