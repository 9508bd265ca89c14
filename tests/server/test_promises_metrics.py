"""status and the Prometheus metrics of a real daemon agree with what its replies said.

Every decide reply carries its pass's size and padded tokens and the pass's own scoring time, so the
batching figures and the token counters can be rebuilt from the replies, and each latency percentile
is bounded by order statistics: no request took less than its pass, nor longer than its client waited.
"""
import time
import urllib.request
from collections import Counter
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jevany_daemon import workloads

from .shared_daemons import running_daemon

ROUNDED = 1e-3      # status rounds milliseconds to 3 decimals


@pytest.fixture(scope="module")
def daemon(tiny_model):
    # greedy, with no padding cap: whatever a worker is handed together shares one pass
    with running_daemon(tiny_model("qwen3", "pointer"), "--max-batch-size", "4", "--batch-policy", "greedy",
                        "--max-padding-waste", "1", "--metrics-port", "0") as d:
        yield d


def scrape(daemon) -> Counter:
    with urllib.request.urlopen(daemon.status()["metrics"], timeout=10) as response:
        text = response.read().decode()
    return Counter({(s.name, tuple(sorted(s.labels.items()))): s.value
                    for family in text_string_to_metric_families(text) for s in family.samples})


def order_statistic(values: list[float], q: float) -> float:
    """The sample status reports as the q-quantile: the same index into the sorted values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_status_on_a_real_daemon_matches_its_replies(daemon):
    # First in the module: the latency window then holds exactly these requests.
    bodies = workloads.short(12, seed=51)
    results, waited = [], []
    with daemon.client(timeout=120, retries=0) as client:
        for body in bodies:                      # one at a time: each client wait bounds one request
            started = time.monotonic()
            results.append(client.call("decide", body))
            waited.append((time.monotonic() - started) * 1000)
        started = time.monotonic()
        burst = client.decide_many(workloads.short(16, seed=52))    # together: they share passes
        waited += [(time.monotonic() - started) * 1000] * len(burst)
        results += burst
        status = client.status()
    assert status["endpoints"] == [daemon.endpoint] and status["control_endpoint"] == daemon.control
    batching = status["batching"]
    passes = Counter()
    for r in results:                            # a pass of size k answered k of these replies
        passes[r["batch"]["size"]] += 1
    assert all(n % size == 0 for size, n in passes.items())
    histogram = {str(size): n // size for size, n in sorted(passes.items())}
    assert batching["batch_size_histogram"] == histogram
    assert (batching["requests"], batching["batches"]) == (len(results), sum(histogram.values()))
    assert batching["mean_batch_size"] == round(len(results) / sum(histogram.values()), 3)
    assert batching["mean_batch_size"] > 1                  # the burst shared passes
    latency = status["latency_ms"]
    assert latency["samples"] == len(results)
    scoring = [r["latency_ms"] for r in results]
    for q in ("p50", "p99"):
        share = int(q[1:]) / 100
        assert order_statistic(scoring, share) - ROUNDED <= latency[q] <= order_statistic(waited, share) + ROUNDED
    assert latency["p50"] <= latency["p99"]


def test_token_counters_add_up_to_the_replies_padded_tokens(daemon):
    before = scrape(daemon)
    with daemon.client(timeout=120, retries=0) as client:
        results = client.decide_many(workloads.long_uneven(8, seed=53))     # uneven widths: real padding
    after = scrape(daemon)

    def moved(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before[key]

    padded = sum(r["batch"]["padded_tokens"] / r["batch"]["size"] for r in results)   # once per pass
    passes = sum(1 / r["batch"]["size"] for r in results)
    assert moved("jevany_tokens_total", kind="padded") == pytest.approx(padded)
    assert moved("jevany_batch_padded_tokens_sum") == pytest.approx(padded)
    assert moved("jevany_batch_padded_tokens_count") == pytest.approx(passes)
    assert 0 < moved("jevany_tokens_total", kind="real") <= moved("jevany_tokens_total", kind="padded")


def listening_on(port: int) -> list[str]:
    """Local addresses of the TCP sockets listening on port, from the kernel's tables."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        for row in rows:
            address, hex_port = row[1].split(":")
            if int(hex_port, 16) == port and row[3] == "0A":       # 0A: LISTEN
                found.append(address)
    return found


def test_the_metrics_port_listens_on_loopback_only(daemon):
    url = urlsplit(daemon.status()["metrics"])
    assert url.hostname == "127.0.0.1" and url.path == "/metrics"
    assert listening_on(url.port) == ["0100007F"]       # 127.0.0.1 as the kernel writes it; no other address
