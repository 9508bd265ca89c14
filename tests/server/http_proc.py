"""A small real HTTP client (the standard library's, keep-alive), for the gateway tests' processes."""
import http.client
import json
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port: int) -> bool:
    """Whether a gateway on port answers /health with 200 (ready); False while it cannot be reached."""
    try:
        client = Http(port, timeout=5)
        try:
            return client.request("GET", "/health")[0] == 200
        finally:
            client.close()
    except OSError:
        return False


class Http:
    """One keep-alive connection; request() returns (status, headers, decoded JSON or text)."""

    def __init__(self, port: int, timeout: float = 120.0):
        self.port, self.timeout = port, timeout
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def request(self, method: str, path: str, body=None, headers: dict | None = None, raw: bytes | None = None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {"Content-Type": "application/json", **(headers or {})}
        self.conn.request(method, path, body=data, headers=sent)
        reply = self.conn.getresponse()
        payload = reply.read()
        kind = reply.getheader("Content-Type") or ""
        value = json.loads(payload) if kind.startswith("application/json") else payload.decode()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, value

    def close(self) -> None:
        self.conn.close()


def decide_stream(port: int, bodies: list, start: int, queue, barrier=None) -> None:
    """POST each body in turn over one connection; report (index, status, answer), answers with our
    additions (noul's probabilities), so they compare with ZeroMQ's whole.

    With a barrier, the first request waits until every party is connected and ready.
    """
    client = Http(port)
    if barrier is not None:
        client.request("GET", "/health")
        barrier.wait(120)
    full = {"X-Jevany-Daemon-Additions": "1"}
    out = [(start + i, *client.request("POST", "/v1/systemone", body, headers=full)[::2])
           for i, body in enumerate(bodies)]
    client.close()
    queue.put(out)


def until_stopped(port: int, body: dict, name: str, stop, queue) -> None:
    """POST the body until stop is set; report each outcome: a status code, or the connection error's name."""
    seen = []
    client = Http(port, timeout=60)
    while not stop.is_set() or len(seen) < 2:
        try:
            seen.append(client.request("POST", "/v1/systemone", body)[0])
        except (OSError, http.client.HTTPException) as exc:
            seen.append(type(exc).__name__)
            client.close()
            client = Http(port, timeout=60)     # a new connection, as any HTTP client would open
    client.close()
    queue.put((name, seen))
