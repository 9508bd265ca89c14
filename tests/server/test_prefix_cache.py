"""The prefix cache through a daemon: hits show in the control endpoint's status and models, and in metrics;
clear_cache reports what it dropped."""
import re
import urllib.request

from jevany_daemon import workloads
from jevany_daemon.parity import compare
from jevany_daemon.server.cache_clears import CacheClears

from .daemons import wait_for

STATE = " ".join(["parcel", "late", "refund"] * 20)
BODIES = [{**body, "state": STATE} for body in workloads.short(4, seed=12)]


def test_a_kept_state_is_not_computed_again_and_clear_cache_empties_every_worker(start_daemon):
    daemon = start_daemon("--workers", "2", "--prefix-cache", "4", "--prefix-min-tokens", "16", "--max-batch-size", "1",
                          "--metrics-port", "0")
    with daemon.client(timeout=60) as client:
        first = client.decide_many(BODIES)
        again = client.decide_many(BODIES)            # each worker has now seen the state at least once
    with daemon.control_client(timeout=60) as control:     # the counters are the control endpoint's alone
        status = control.status()
        models = control.models()["models"][0]
    cache = status["prefix_cache"]
    assert cache["enabled"] and cache["min_tokens"] == 16 and cache["max_entries"] == 4
    assert 1 <= cache["size"] <= 2 and cache["hits"] >= len(BODIES) * 2 - 2 and cache["bytes"] > 0
    assert models["prefix_cache"]["hits"] == cache["hits"]
    report = compare(first, again)        # a hit continues from kept keys: equal within float noise
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == []

    def scraped_hits():
        with urllib.request.urlopen(status["metrics"], timeout=10) as response:
            found = re.search(r'^jevany_prefix_cache\{what="hits"\} (\S+)$', response.read().decode(), re.M)
        return found and float(found.group(1)) == cache["hits"]

    wait_for(scraped_hits, 30, "the hits in the metrics")
    with daemon.control_client(timeout=60) as control:
        assert control.clear_cache() == {"cleared": cache["size"]}
        assert control.clear_cache() == {"cleared": 0}
    with daemon.client(timeout=60) as client:
        client.decide_many(BODIES[:1])
    with daemon.control_client(timeout=60) as control:
        assert control.status()["prefix_cache"]["size"] == 1


def test_the_cache_can_be_turned_off(start_daemon):
    daemon = start_daemon("--prefix-cache", "0", "--prefix-min-tokens", "16")
    with daemon.client(timeout=60) as client:
        client.decide_many(BODIES * 2)
    with daemon.control_client(timeout=60) as control:
        cache = control.status()["prefix_cache"]
        assert not cache["enabled"] and cache["size"] == cache["hits"] == 0
        assert control.clear_cache() == {"cleared": 0}


def test_a_clear_completes_when_every_worker_answered_or_died():
    clears = CacheClears()
    clears.begin("waiter", {b"w0", b"w1"})
    assert clears.answered(b"w0", 3) == []
    assert clears.gone(b"w1") == [("waiter", 3)]
    assert clears.answered(b"w0", 5) == []          # nothing pending any more
