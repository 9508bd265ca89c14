"""Shared pieces of the reliability runs: raw sockets, /proc sampling, percentiles, a daemon.

Imported by the tests and by the standalone runs (``python -m
tests.reliability.load`` ...), and by their spawned client processes, so it
never imports torch: only `tiny_model_dir` and `reference_answers` do, when
called.
"""
import math
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import msgpack
import zmq

from jevany_client import JevClient, JevTimeoutError

ARCH, READOUT = "qwen3", "pointer"
POLL_S = 0.05   # how often a wait_until predicate is re-checked


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(payload: bytes) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


# --- waiting --------------------------------------------------------------


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll until predicate() is truthy and return its value; AssertionError naming `what` after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(POLL_S)


# --- /proc ----------------------------------------------------------------


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# --- numbers --------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latency_summary(seconds: list[float]) -> dict:
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 0.50), 2),
            "p99_ms": round(percentile(ms, 0.99), 2), "max_ms": round(max(ms, default=0.0), 2)}


def stop_processes(procs: list, grace_s: float = 10.0) -> None:
    """Join every started process; kill whatever is still running after the grace period."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)


# --- sockets --------------------------------------------------------------


class RawDealer:
    """A bare DEALER, for payloads and behaviours JevClient would never produce."""

    def __init__(self, endpoint: str, *, rcvhwm: int | None = None, context: zmq.Context | None = None):
        self._own_context = context is None
        self.context = context or zmq.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if rcvhwm is not None:
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.connect(endpoint)

    def __enter__(self) -> "RawDealer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, payload: bytes | dict) -> None:
        self.sock.send(payload if isinstance(payload, bytes) else pack(payload))

    def recv(self, timeout: float) -> dict | None:
        """The next reply, decoded, or None when none comes within timeout seconds."""
        if not self.sock.poll(max(0, int(timeout * 1000))):
            return None
        return unpack(self.sock.recv())

    def call(self, message: dict, timeout: float = 60.0) -> dict:
        """Send one message and return the reply with its id; replies to other ids are an error."""
        self.send(message)
        reply = self.recv(timeout)
        assert reply is not None, f"no reply to {message.get('op')} {message.get('id')!r} within {timeout}s"
        assert reply.get("id") == message["id"], f"reply for {reply.get('id')!r} while awaiting {message['id']!r}"
        return reply

    def close(self) -> None:
        self.sock.close(linger=0)
        if self._own_context:
            self.context.term()


def status(endpoint: str, timeout: float = 10.0) -> dict:
    with JevClient(endpoint, timeout=timeout) as client:
        return client.status()


def worker_pids(endpoint: str) -> list[int]:
    return [w["pid"] for w in status(endpoint)["workers"]]


def accounted(requests: dict) -> int:
    """Requests a status's counts account for: replies (ok + error), and decide requests dropped unscored
    because their client had left (departed: no reply, so in neither count)."""
    return requests["ok"] + requests["error"] + requests.get("departed", 0)


def answered_total(endpoint: str) -> int:
    """Requests the daemon has accounted for so far (accounted), this status call excluded."""
    return accounted(status(endpoint)["requests"])


def wait_answered(endpoint: str, at_least: int, timeout: float) -> int:
    """Wait until the daemon has accounted for `at_least` requests (replies, or dropped for a client that
    left), besides these polls, and its queue is empty."""
    polls = 0

    def settled():
        nonlocal polls
        s = status(endpoint)
        total = accounted(s["requests"]) - polls   # each earlier poll was counted
        polls += 1
        idle = s["queue"]["depth"] == 0 and not any(w.get("inflight") for w in s["workers"])
        return total if total >= at_least and idle else 0

    return wait_until(settled, timeout, f"daemon answered {at_least} requests and went idle")


# --- a daemon for the standalone runs ----------------------------------------


def tiny_model_dir() -> Path:
    """The tiny pointer model, built once into $JEVANY_CACHE_DIR (default ~/.cache/jevany)."""
    cache = Path(os.environ.get("JEVANY_CACHE_DIR") or Path.home() / ".cache" / "jevany")
    target = cache / f"reliability-tiny-{ARCH}-{READOUT}"
    if not (target / "head.pt").is_file():
        from jevany_daemon.model.tiny import build_tiny_model

        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=cache if cache.is_dir() else None))
        build_tiny_model(staging / "model", arch=ARCH, readout=READOUT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(staging / "model", target)
        shutil.rmtree(staging, ignore_errors=True)
    return target


@contextmanager
def running_daemon(model: Path, *serve_args: str):
    """A `jevany-daemon serve` for a standalone run, ready on entry, stopped and removed on exit."""
    from tests.server.daemons import Daemon

    daemon = Daemon(Path(tempfile.mkdtemp(prefix="jvr-")), model, *serve_args)
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            try:
                daemon.stop()
            except Exception:   # noqa: BLE001 - stop() already killed it; report the run's own error
                pass
        shutil.rmtree(daemon.dir, ignore_errors=True)


def reference_answers(model, bodies: list[dict]) -> list[dict]:
    """Serial, in-process scoring of each body (batch size 1): what every daemon reply must match.

    `model` is a model directory or an already loaded DecisionModel.
    """
    from transformers.utils import logging as hf_logging

    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine
    from jevany_daemon.model.loading import load_model

    hf_logging.disable_progress_bar()
    if isinstance(model, (str, Path)):
        model = load_model(str(model), device="cpu", dtype="fp32")
    engine = Engine(model, EngineConfig())
    return [engine.decide(body) for body in bodies]


def ping_until_ready(endpoint: str, timeout: float = 30.0) -> None:
    with JevClient(endpoint, timeout=1.0) as client:
        def pong():
            try:
                return client.ping()["pong"]
            except JevTimeoutError:
                return False
        wait_until(pong, timeout, f"a pong from {endpoint}")
