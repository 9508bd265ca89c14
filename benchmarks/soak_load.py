"""The soak's client processes (soak_bench.py): closed-loop ZeroMQ and HTTP callers, and churn.

Each runs in a process of its own (spawned: no torch, no state shared with
the parent) until its stop event is set, and puts its replies on the
report queue in batches: one (done_at, seconds, kind, outcome) per reply,
done_at on the shared monotonic clock. A closed-loop caller finishes the
request it is in before it stops, so every request it sent is counted: as
an answer, a typed error, or `lost` (no reply within REPLY_WITHIN_S).

    zmq     JevClient (retries off: an overloaded or worker_lost shows), mixed sizes; one request in
            ten with a short deadline (ok or deadline_exceeded), one in fifty malformed (invalid_request)
    http    one keep-alive connection, POST /v1/systemone; one body in fifty invalid (422)
    churn   a request on a fresh connection, then gone without reading: up to CHURN_PER_S a second
"""
import http.client
import json
import socket
import time

import zmq

from jevany_client import JevClient, JevanyError
from jevany_client.errors import JevTimeoutError
from jevany_client.protocol import encode_request
from jevany_daemon import workloads

REPLY_WITHIN_S = 60.0
SHORT_DEADLINE_MS = 150     # a tenth of the ZeroMQ requests: scored only if taken within it
CHURN_PER_S = 20.0
REPORT_EVERY = 64           # replies a caller gathers before it puts them on the report queue
EXPECTED = {"decide": ("ok",), "deadline": ("ok", "deadline_exceeded"), "malformed": ("invalid_request",),
            "http": ("200",), "http_invalid": ("422",)}


def bodies(seed: int, long: bool = False) -> list[dict]:
    """Short states and longer mixed ones, so passes vary in size and shape as a real fleet's do; long:
    a third more from agent sessions, transcripts of 300-1,100 tokens growing turn by turn, past the
    prefix cache's least (so it keeps, reuses and evicts them)."""
    mix = workloads.short(48, seed=seed) + workloads.mixed(48, seed=seed + 1, max_words=60)
    return mix + workloads.agent(8, 6, seed=seed + 2, start=(300, 700)) if long else mix


class Replies:
    def __init__(self, out, who: str):
        self.out, self.who, self.batch = out, who, []

    def add(self, started: float, kind: str, outcome: str) -> None:
        now = time.monotonic()
        self.batch.append((now, now - started, kind, outcome))
        if len(self.batch) >= REPORT_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.batch:
            self.out.put((self.who, self.batch))
            self.batch = []


def zmq_caller(endpoint: str, index: int, long: bool, stop, out) -> None:
    replies, work = Replies(out, f"zmq-{index}"), bodies(300 + index, long)
    with JevClient(endpoint, timeout=REPLY_WITHIN_S, retries=0) as client:
        n = 0
        while not stop.is_set():
            body, n = work[n % len(work)], n + 1
            kind, timeout_ms = "decide", None
            if n % 50 == 17:
                kind, body = "malformed", {**body, "questions": {}}
            elif n % 10 == 3:
                kind, timeout_ms = "deadline", SHORT_DEADLINE_MS
            started = time.monotonic()
            try:
                client.call("decide", body, timeout_ms=timeout_ms)
                outcome = "ok"
            except JevTimeoutError:
                outcome = "lost"
            except JevanyError as err:
                outcome = err.code
            replies.add(started, kind, outcome)
    replies.flush()


def http_caller(port: int, index: int, long: bool, stop, out) -> None:
    replies, work = Replies(out, f"http-{index}"), bodies(500 + index, long)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REPLY_WITHIN_S)
    n = 0
    while not stop.is_set():
        body, n = work[n % len(work)], n + 1
        kind = "http"
        if n % 50 == 29:
            kind, body = "http_invalid", {**body, "questions": "not a map"}
        started = time.monotonic()
        try:
            conn.request("POST", "/v1/systemone", body=json.dumps(body), headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            reply.read()
            outcome = str(reply.status)
        except TimeoutError:
            outcome = "lost"
            conn.close()
        except (OSError, http.client.HTTPException) as exc:     # the gateway closed the connection: a fresh one
            outcome = f"connection: {type(exc).__name__}"
            conn.close()
        replies.add(started, kind, outcome)
    conn.close()
    replies.flush()


def zmq_churn(endpoint: str, stop, out) -> None:
    """A decide on a fresh connection, then gone: the reply (if any) goes to nobody."""
    ctx, work, sent, n = zmq.Context(), bodies(700), 0, 0
    began = time.monotonic()
    while not stop.is_set():
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 200)          # long enough for the request to leave, then closed
        sock.connect(endpoint)
        sock.send(encode_request(f"churn-{n}", "decide", work[n % len(work)]))
        sock.close()
        n, sent = n + 1, sent + 1
        stop.wait(max(0.0, began + n / CHURN_PER_S - time.monotonic()))
    ctx.term()
    out.put(("zmq-churn", [(time.monotonic(), 0.0, "churn", f"sent {sent}")]))


def http_churn(port: int, stop, out) -> None:
    work, sent, n = bodies(900), 0, 0
    began = time.monotonic()
    while not stop.is_set():
        data = json.dumps(work[n % len(work)]).encode()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
            sent += 1
        except OSError:
            pass
        n += 1
        stop.wait(max(0.0, began + n / CHURN_PER_S - time.monotonic()))
    out.put(("http-churn", [(time.monotonic(), 0.0, "churn", f"sent {sent}")]))
