"""`jevany_prefix_cache{what}` on a real daemon: every series equals status's prefix cache figures and
moves with them, through misses, hits, evictions and a clear; and how status adds up the workers' caches."""
from jevany_daemon import workloads

from .daemons import wait_for
from .test_promises_metrics import scrape

WHATS = ("size", "bytes", "hits", "misses", "evictions", "reused_tokens")
BODY = workloads.short(1, seed=12)[0]
# Three states long enough to be kept (--prefix-min-tokens 16); the cache holds two (--prefix-cache 2).
STATES = [" ".join([word, "late", "refund"] * 20) for word in ("parcel", "invoice", "courier")]


def agreed(daemon) -> dict:
    """status's figures once every series of the metric shows them (the gauges are set on the daemon's tick)."""

    def same():
        with daemon.control_client(timeout=30) as control:      # the counters are the control endpoint's alone
            metrics, status = scrape(daemon), control.status()["prefix_cache"]
        shown = {what: metrics.get(("jevany_prefix_cache", (("what", what),))) for what in WHATS}
        return {what: status[what] for what in WHATS} if shown == {w: float(status[w]) for w in WHATS} else None

    return wait_for(same, 30, "jevany_prefix_cache showing status's prefix cache figures")


def test_the_prefix_cache_metric_equals_status_and_moves_with_it(start_daemon):
    daemon = start_daemon("--prefix-cache", "2", "--prefix-min-tokens", "16", "--max-batch-size", "1",
                          "--metrics-port", "0")

    def decide(state):
        with daemon.client(timeout=60, retries=0) as client:
            client.call("decide", {**BODY, "state": state})

    fresh = agreed(daemon)          # every series is there from the start
    assert fresh["size"] == fresh["hits"] == fresh["misses"] == fresh["evictions"] == 0

    decide(STATES[0])
    missed = agreed(daemon)
    assert missed["misses"] > 0 and missed["size"] == 1 and missed["bytes"] > fresh["bytes"]
    assert missed["hits"] == 0

    decide(STATES[0])               # the same state again: taken from the cache
    hit = agreed(daemon)
    assert hit["hits"] > 0 and hit["reused_tokens"] > missed["reused_tokens"]
    assert (hit["size"], hit["misses"], hit["bytes"]) == (1, missed["misses"], missed["bytes"])

    decide(STATES[1])
    decide(STATES[2])               # a third state: the least recent one goes
    full = agreed(daemon)
    assert full["size"] == 2 and full["evictions"] >= 1 and full["misses"] > hit["misses"]

    with daemon.control_client(timeout=60) as control:
        assert control.clear_cache() == {"cleared": 2}
    cleared = agreed(daemon)        # the entries and their bytes go; the counts stay
    assert cleared["size"] == 0 and cleared["bytes"] == fresh["bytes"]
    counts = ("hits", "misses", "evictions")
    assert {w: cleared[w] for w in counts} == {w: full[w] for w in counts}


def test_status_sums_the_workers_caches_but_counts_the_pinned_head_once():
    # Every worker pins the same prompt head, so the daemon's pinned_tokens is that head's size: summing it would
    # report the head times the workers. The per-worker counts (size, hits, ...) are separate caches and do add up.
    from types import SimpleNamespace

    from jevany_daemon.server.settings import ServeSettings
    from jevany_daemon.server.status import prefix_cache

    def worker(size, hits):
        return SimpleNamespace(stats={"prefix_cache": {"enabled": True, "size": size, "hits": hits,
                                                       "pinned_tokens": 40}})

    workers = [worker(2, 5), worker(1, 3)]
    cache = prefix_cache(SimpleNamespace(serving=lambda: workers), ServeSettings())
    assert (cache["size"], cache["hits"], cache["pinned_tokens"]) == (3, 8, 40)
