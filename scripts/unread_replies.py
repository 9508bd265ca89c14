"""Clients that ask for big replies and never read them: what the supervisor holds for them.

    PYTHONPATH=.:client .venv/bin/python scripts/unread_replies.py --clients 8 --requests 4

Starts a daemon on a tiny choice model (built into a temporary directory unless --model names one),
warms it with one big reply to a client that reads, then connects --clients DEALERs that each send
--requests decide requests whose answers echo about 7.4 MB of option keys, and read nothing (a
receive high-water mark of 1, so what piles up piles up at the daemon). It prints the supervisor's
RSS before, at its peak while the replies go out, and --hold-s seconds later with the non-readers
still connected; then whether a client that reads still gets a big reply, and what `status` counts
as dropped. Exit 0 always: it measures, the tests judge.
"""
import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # the repository root, for tests.server

from tests.server.daemons import Daemon, rss_kb  # noqa: E402

KEY_BYTES = 140_000      # 52 options of this many bytes: a 7.3 MB request, a 7.4 MB reply
MB = 1 << 20
OPTIONS = 52             # the choice readout's cap; its prompt shows descriptions, not keys


def big_body(tag: str) -> dict:
    criteria = {f"{tag}-{j}-" + "k" * KEY_BYTES: "o" for j in range(OPTIONS)}
    return {"state": "s", "questions": {"q": {"type": "choice", "criteria": criteria}}}


def request(rid, body: dict) -> bytes:
    return msgpack.packb({"v": 1, "id": rid, "op": "decide", "body": body})


class PeakRss(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stopped = pid, rss_kb(pid), threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.01):
            self.peak = max(self.peak, rss_kb(self.pid))


def decided(daemon: Daemon) -> int:
    with daemon.control_client(timeout=30) as control:
        return control.status()["requests"]["by_op"].get("decide", 0)


def read_one(ctx, endpoint: str, payload: bytes, within_s: float = 60.0) -> float | None:
    """Seconds a client that reads waits for its reply; None if none came."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    started = time.monotonic()
    sock.send(payload)
    got = sock.poll(int(within_s * 1000))
    if got:
        sock.recv()
    sock.close()
    return time.monotonic() - started if got else None


def attack(daemon: Daemon, clients: int, requests: int, hold_s: float) -> dict:
    pid = daemon.proc.pid
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, clients + 16)
    try:
        assert read_one(ctx, daemon.endpoint, request("warm", big_body("warm"))) is not None
        before = rss_kb(pid)
        base = decided(daemon)
        payloads = [request(i, big_body(f"r{i}")) for i in range(requests)]
        sampler = PeakRss(pid)
        sampler.start()
        hogs = []
        for _ in range(clients):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 1)
            sock.connect(daemon.endpoint)
            hogs.append(sock)
        started = time.monotonic()
        for sock in hogs:
            for payload in payloads:
                sock.send(payload)
        deadline = started + 300
        while decided(daemon) < base + clients * requests and time.monotonic() < deadline:
            time.sleep(0.05)       # polling the daemon's counters, not standing in for a reply
        answered_s = time.monotonic() - started
        time.sleep(hold_s)         # the measurement: what stays held while the non-readers stay connected
        held = rss_kb(pid)
        reader_s = read_one(ctx, daemon.endpoint, request("reader", big_body("reader")))
        sampler.stopped.set()
        sampler.join(5)
        with daemon.control_client(timeout=30) as control:
            clients_status = control.status()["clients"]
        for sock in hogs:
            sock.close()
        time.sleep(hold_s)         # and what is left once they are gone
        gone = rss_kb(pid)
        return {"clients": clients, "requests_each": requests, "reply_bytes": len(payloads[0]),
                "rss_before_mb": round(before / 1024, 1), "rss_peak_mb": round(sampler.peak / 1024, 1),
                "rss_held_mb": round(held / 1024, 1), "held_after_s": hold_s,
                "rss_after_they_left_mb": round(gone / 1024, 1),
                "answered_in_s": round(answered_s, 2),
                "reader_waited_s": None if reader_s is None else round(reader_s, 2),
                "replies_dropped": clients_status.get("replies_dropped"),
                "replies_held_mb": (None if "replies_held_bytes" not in clients_status
                                    else round(clients_status["replies_held_bytes"] / MB, 1)),
                "closed_not_reading": clients_status.get("closed_not_reading")}
    finally:
        ctx.destroy(linger=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--hold-s", type=float, default=5.0)
    parser.add_argument("--model", type=Path, default=None, help="a choice-readout model directory")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model = args.model
    if model is None:
        from jevany_daemon.model.tiny import build_tiny_model
        model = build_tiny_model(Path(tempfile.mkdtemp(prefix="jvt-")), arch="qwen3", readout="choice")
    daemon = Daemon(Path(tempfile.mkdtemp(prefix="jvd-")), model)
    try:
        daemon.wait_ready()
        result = attack(daemon, args.clients, args.requests, args.hold_s)
    finally:
        daemon.stop()
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
