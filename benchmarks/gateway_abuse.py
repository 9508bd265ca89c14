"""Hostile HTTP clients against one daemon's gateway, and what everybody else sees meanwhile.

One daemon (tiny qwen3, choice readout) with --http on loopback; each attack
runs for --seconds and prints its figures as JSON:

- slow-bodies: 8 connections each declare a body of the cap (8 MiB) and send a byte
  every 5 s (a new connection when the gateway closes one), while a
  legitimate client POSTs a small body every 0.5 s: its statuses counted;
- pipelined: 4 connections (from 4 loopback addresses) each pipeline two
  bodies whose 422 answers echo them three times over, and read 64 bytes a
  second: the gateway's RSS sampled every second, and again after the
  connections close;
- busy-loop: bursts of 4 bodies that each take the gateway's loop seconds
  to refuse (7.9 MB whose 422s echo them), on keep-alive connections, while
  4 clients POST small bodies on theirs: statuses and the slowest reply of
  each kind (a reply the gateway's reader of the daemon failed to see would
  wait for the next request, or for 600 s).

Run from the repository's root: the daemon it starts imports the code there.

    PYTHONPATH=.:client .venv/bin/python benchmarks/gateway_abuse.py slow-bodies --seconds 75
"""
import argparse
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import free_port, rss_kb   # noqa: E402

from jevany_client import JevClient   # noqa: E402
from jevany_daemon.model.tiny import build_tiny_model   # noqa: E402

AUTH = {"header": b""}      # an Authorization header, when the daemon is given a token
TEXT = json.dumps({"state": {"ticket": "parcel lost"}, "questions": {"u": {"type": "noul"}}}).encode()


class Daemon:
    def __init__(self, directory: Path, token: str | None = None, max_message_bytes: int | None = None):
        self.port = free_port()
        self.max_message = max_message_bytes or 8 << 20
        extra = ["--max-message-bytes", str(max_message_bytes)] if max_message_bytes else []
        if token:
            (directory / "token").write_text(token)
            extra += ["--http-token-file", str(directory / "token")]
        model = build_tiny_model(directory / "model")
        endpoint, self.control = f"ipc://{directory}/d.sock", f"ipc://{directory}/c.sock"
        self.log = open(directory / "daemon.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "jevany_daemon", "serve", "--model", str(model),
                                      "--bind", endpoint, "--control", self.control,
                                      "--http", f"127.0.0.1:{self.port}", *extra], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if post(self.port, TEXT)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)       # polling a loading daemon
        with JevClient(self.control, timeout=30) as control:
            self.gateway = control.status()["http"]["pid"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def read_reply(conn) -> bytes:
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            if sep and line.lower().startswith(b"content-length:") and len(body) >= int(line.split(b":")[1]):
                return data


def post(port: int, body: bytes, extra: bytes = b"", timeout: float = 30) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s%s"
                     b"Content-Length: %d\r\n\r\n" % (AUTH["header"], extra, len(body)) + body)
        reply = read_reply(conn)
    return (int(reply.split(b" ", 2)[1]) if reply else 0), reply


def slow_bodies(daemon: Daemon, seconds: float) -> dict:
    stop, outcomes = threading.Event(), Counter()

    def attacker():
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as conn:
                    conn.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n" % daemon.max_message)
                    while not stop.wait(5):
                        conn.sendall(b" ")
                        conn.setblocking(False)
                        try:
                            if conn.recv(65536) is not None:
                                outcomes["attacker closed"] += 1
                                break
                        except BlockingIOError:
                            pass
                        finally:
                            conn.setblocking(True)
            except OSError:
                outcomes["attacker closed"] += 1

    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(1)      # the attackers' headers are in
    statuses, deadline = Counter(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            statuses[post(daemon.port, TEXT)[0]] += 1
        except OSError as exc:
            statuses[type(exc).__name__] += 1
        time.sleep(max(0.0, 0.5 - (time.monotonic() - started)))
    stop.set()
    return {"legitimate": dict(statuses), "attacker_connections_closed": outcomes["attacker closed"],
            "ok_share": statuses[200] / max(1, sum(statuses.values()))}


def echoed(size: int) -> bytes:
    """A body of about size bytes that /v1/systemone refuses with a 422 echoing it about three times over
    (each question of an unknown type is reported once per type it might have been)."""
    count = max(1, size // 130)
    return json.dumps({"state": "x", "questions": {str(i): {"type": "nope", "x": "a" * 100}
                                                   for i in range(count)}}).encode()


def pipelined(daemon: Daemon, seconds: float, connections: int = 4, body_bytes: int = 7 << 20,
              read_per_s: int = 64) -> dict:
    """Each connection pipelines two bodies whose answers are thrice their size, then reads read_per_s
    bytes a second; the gateway's RSS sampled every second, then again once the connections are closed."""
    body = echoed(body_bytes)
    request = (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
               b"Content-Length: %d\r\n\r\n" % (AUTH["header"], len(body)) + body)
    before = rss_kb(daemon.gateway)
    conns, closed = [], 0
    for i in range(connections):
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.bind((f"127.0.0.{10 + i}", 0))        # each its own client: no client's share of bodies is met
        conn.connect(("127.0.0.1", daemon.port))
        conn.setblocking(False)
        conns.append(conn)
    unsent = {conn: memoryview(request * 2) for conn in conns}      # sent as the gateway takes it
    samples, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline and conns:
        for conn in list(conns):
            try:
                if unsent[conn]:
                    unsent[conn] = unsent[conn][conn.send(unsent[conn]):]
                # TCP_INFO's state: a reset is seen before the few bytes still unread
                if conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 7 or conn.recv(read_per_s) == b"":
                    raise ConnectionResetError
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                closed += 1
                conns.remove(conn)
                conn.close()
        samples.append(rss_kb(daemon.gateway))
        time.sleep(1)
    for conn in conns:
        conn.close()
    time.sleep(3)
    return {"body_bytes": len(body), "rss_before_kb": before, "rss_max_kb": max(samples),
            "rss_after_close_kb": rss_kb(daemon.gateway), "closed_by_gateway": closed, "samples_kb": samples}


def busy_loop(daemon: Daemon, seconds: float) -> dict:
    """Bursts of 4 bodies that each take the gateway's loop seconds to refuse, on 4 keep-alive
    connections, while 4 clients POST small bodies on theirs; every reply's time and status."""
    bomb = echoed(int(daemon.max_message * 0.9))
    stop, lock = threading.Event(), threading.Lock()
    seen = {"busy": Counter(), "legitimate": Counter()}
    slowest = {"busy": 0.0, "legitimate": 0.0}
    barrier = threading.Barrier(4)

    def run(kind: str, body: bytes) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=300)
        headers = {"Content-Type": "application/json"}
        if AUTH["header"]:
            headers["Authorization"] = AUTH["header"].decode().split(": ", 1)[1].strip()
        while not stop.is_set():
            if kind == "busy":
                try:
                    barrier.wait(60)
                except threading.BrokenBarrierError:
                    return
            started = time.monotonic()
            try:
                conn.request("POST", "/v1/systemone", body, headers)
                reply = conn.getresponse()
                reply.read()
                outcome = reply.status
            except (OSError, http.client.HTTPException) as exc:
                outcome = type(exc).__name__
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=300)
            with lock:
                seen[kind][outcome] += 1
                slowest[kind] = max(slowest[kind], time.monotonic() - started)

    threads = [threading.Thread(target=run, args=("busy", bomb)) for _ in range(4)]
    threads += [threading.Thread(target=run, args=("legitimate", TEXT)) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    barrier.abort()
    for t in threads:
        t.join(600)
    return {kind: {"statuses": dict(seen[kind]), "slowest_s": round(slowest[kind], 2)} for kind in seen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("attack", choices=("slow-bodies", "pipelined", "busy-loop"))
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--token", default=None, help="serve behind this token (--http-token-file)")
    parser.add_argument("--max-message-bytes", type=int, default=None, help="the daemon's (8 MiB by default)")
    parser.add_argument("--connections", type=int, default=4, help="pipelined: how many")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="jv-abuse-"))
    if args.token:
        AUTH["header"] = b"Authorization: Bearer %s\r\n" % args.token.encode()
    daemon = Daemon(directory, args.token, args.max_message_bytes)
    try:
        if args.attack == "slow-bodies":
            result = slow_bodies(daemon, args.seconds)
        elif args.attack == "pipelined":
            result = pipelined(daemon, args.seconds, args.connections,
                               int((args.max_message_bytes or 8 << 20) * 0.9))
        else:
            result = busy_loop(daemon, args.seconds)
    finally:
        daemon.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
