"""One benchmark client process: jevany-client only, no torch, like the fleet it stands for.

bench.py starts a pool of these as plain subprocesses (not multiprocessing
spawn, which would re-import bench.py and with it torch into every client)
and steers each over the connection whose file descriptor it is given:

    → (endpoint, [body...])   connect, ping, reply "ready"; an http://HOST:PORT endpoint
                              posts each body to /v1/systemone instead (the HTTP gateway)
    → "go"                    send the bodies one after another, each after the last reply
    ← [seconds...]            each request's latency, in order
    → None                    exit
"""
import http.client
import json
import socket
import sys
import time
from multiprocessing.connection import Connection

from jevany_client import JevClient
from jevany_client.errors import ShuttingDownError


def main(fd: int) -> None:
    conn = Connection(fd)
    conn.send("started")
    while True:
        task = conn.recv()
        if task is None:
            return
        endpoint, bodies = task
        if endpoint.startswith("http://"):
            conn.send(over_http(endpoint, bodies, conn))
            continue
        with JevClient(endpoint, timeout=600, retries=0) as client:
            client.ping()                    # connected before the clock starts
            conn.send("ready")
            conn.recv()                      # go
            latencies = []
            for body in bodies:
                started = time.perf_counter()
                client.call("decide", body)
                latencies.append(time.perf_counter() - started)
        conn.send(latencies)


def over_http(endpoint: str, bodies: list, conn: Connection) -> list:
    """The same closed loop through the gateway: one keep-alive connection, JSON bodies."""
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    session = http.client.HTTPConnection(host, int(port), timeout=600)
    session.connect()
    # As requests (urllib3) does: without it, http.client's body, sent after its headers,
    # can wait on Nagle's algorithm.
    session.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    headers = {"Content-Type": "application/json"}
    session.request("GET", "/health")           # connected before the clock starts
    session.getresponse().read()
    conn.send("ready")
    conn.recv()                              # go
    latencies = []
    for body in bodies:
        started = time.perf_counter()
        session.request("POST", "/v1/systemone", body=json.dumps(body), headers=headers)
        reply = session.getresponse()
        payload = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {payload[:200]!r}")
        json.loads(payload)                  # a caller decodes the answer, as JevClient does
        latencies.append(time.perf_counter() - started)
    session.close()
    return latencies


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]))
    except ShuttingDownError as exc:
        # The daemon was stopped mid-run (a benchmark cut by its time limit stops them all): one line
        # each, not 32 tracebacks burying the figures in the log.
        print(f"loadgen: {exc}", file=sys.stderr)
        sys.exit(1)
