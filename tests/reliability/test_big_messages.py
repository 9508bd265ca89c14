"""Big messages within the size limit must cost the daemon in proportion to their bytes, and briefly.

Both tests here found bugs, since fixed; the sizes are small so each runs in seconds.
"""
import threading

import pytest

from jevany_client.errors import ContextLengthError
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon import workloads

from .conftest import SHARED_MESSAGE_LIMIT
from .harness import ARCH, READOUT, RawDealer, pack, rss_kb, status, wait_answered

MIB = 1024   # kB


class PeakRss(threading.Thread):
    def __init__(self, pid: int, every_s: float = 0.01):
        super().__init__(daemon=True)
        self.pid, self.every_s, self.peak = pid, every_s, rss_kb(pid)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.peak = max(self.peak, rss_kb(self.pid))

    def __enter__(self) -> "PeakRss":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.join(5)


def test_queued_requests_cost_their_wire_size_not_their_decoded_size(shared_daemon):
    endpoint, pid = shared_daemon.endpoint, shared_daemon.proc.pid
    n = 40
    # Valid for the supervisor (it does not check the model), refused by the worker at once.
    big = {"state": [[]] * 48_000, "questions": {"q": {"type": "noul"}}, "model": "someone-else"}
    payloads = [pack({"v": 1, "id": f"big-{i}", "op": "decide", "body": big}) for i in range(n)]
    assert len(payloads[0]) < SHARED_MESSAGE_LIMIT
    base = status(endpoint)
    base_count = base["requests"]["ok"] + base["requests"]["error"]
    before = rss_kb(pid)
    with RawDealer(endpoint) as sock, PeakRss(pid) as sampler:
        for i, body in enumerate(workloads.short(8, seed=3)):    # keep the worker busy first
            sock.send({"v": 1, "id": f"busy-{i}", "op": "decide", "body": body})
        for payload in payloads:
            sock.send(payload)
        replies = [sock.recv(120) for _ in range(8 + n)]
    wait_answered(endpoint, base_count + 1 + 8 + n, timeout=60)
    assert all(r is not None for r in replies)
    assert sum(r["error"]["code"] == "unknown_model" for r in replies if not r["ok"]) == n
    wire_kb = n * len(payloads[0]) // 1024
    print(f"{n} queued messages, {wire_kb} kB on the wire: supervisor RSS {before} -> peak {sampler.peak} kB")
    assert sampler.peak - before < 8 * wire_kb + 16 * MIB


class CountingTokenizer:
    """The encoder's tokenizer, recording the length of every text it is given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.texts = tokenizer, []

    def __call__(self, text, *args, **kwargs):
        self.texts.append(len(text))
        return self.tokenizer(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_a_state_far_over_the_token_limit_is_refused_without_tokenizing_it(loaded_model):
    engine = Engine(loaded_model(ARCH, READOUT), EngineConfig())
    body = {"state": "word " * 200_000, "questions": {"q": {"type": "noul"}}}
    counting = engine.encoder.tokenizer = CountingTokenizer(engine.encoder.tokenizer)
    with pytest.raises(ContextLengthError, match=r"^state exceeds \d+ tokens: at least \d+$"):
        engine.admit(body)
    assert max(counting.texts, default=0) < 10_000      # the million characters never reached it
