"""The status op's figures and systemd's status line, from the parts they read (no daemon)."""
from types import SimpleNamespace

from jevany_daemon.server.request_queue import RequestQueue
from jevany_daemon.server.status import Counters, StatusLine, add_plan_counts, merge_batching, prefix_cache


def test_latency_is_kept_in_milliseconds_and_its_percentiles_are_taken_at_their_rank():
    counters = Counters()
    for ms in range(10, 0, -1):
        counters.record("decide", None, ms / 1000)
    # Ten samples: the median is the sixth smallest (rank int(0.5 * 10)), p99 the largest.
    assert counters.latency_ms() == {"p50": 6.0, "p99": 10.0, "samples": 10, "waited_for_load": 0}


def test_a_request_that_waited_for_the_load_is_counted_apart_from_the_percentiles():
    counters = Counters()
    counters.record("decide", None, 0.002)
    counters.record("decide", None, 30.0, before_ready=True)      # the model's load, not the daemon's pace
    assert counters.latency_ms() == {"p50": 2.0, "p99": 2.0, "samples": 1, "waited_for_load": 1}


def test_outcomes_are_counted_by_op_and_code_and_only_decide_by_transport():
    counters = Counters()
    counters.record("decide", None, 0.001, transport="http")
    counters.record("decide", "overloaded", transport="zmq")
    counters.record("status", None)
    counters.record(None, "invalid_message")
    assert counters.requests() == {
        "ok": 2, "error": 2, "by_error_code": {"overloaded": 1, "invalid_message": 1},
        "by_op": {"decide": 2, "status": 1, "unreadable": 1}, "decide_by_transport": {"zmq": 1, "http": 1},
        "departed": 0, "withdrawn_late": 0}


def test_batching_sums_the_workers_and_orders_the_histogram_by_size():
    merged = merge_batching([{"batches": 2, "requests": 12, "busy_s": 0.5, "batch_size_histogram": {"10": 1, "2": 1}},
                             {"batches": 1, "requests": 3, "non_finite": 1, "batch_size_histogram": {"3": 1}}],
                            max_batch_size=16, max_packed_tokens=4096)
    assert list(merged["batch_size_histogram"].items()) == [("2", 1), ("3", 1), ("10", 1)]
    assert (merged["batches"], merged["requests"], merged["mean_batch_size"]) == (3, 15, 5.0)
    assert (merged["busy_s"], merged["non_finite"]) == (0.5, 1)


def test_plan_counts_of_two_workers_add_up_and_a_worker_without_a_plan_adds_nothing():
    first = {"planned": 1, "eager": {"shape": 1}, "recompiles": 2}
    second = {"planned": 3, "eager": {"shape": 2, "media": 1}, "recompiles": 1}
    assert add_plan_counts(first, second) == {"planned": 4, "eager": {"shape": 3, "media": 1}, "recompiles": 3}
    assert add_plan_counts(first, None) is first
    assert add_plan_counts(None, second) == second


def _pool(*workers):
    return SimpleNamespace(serving=lambda: list(workers), workers=list(workers), gone_stats={})


def test_the_status_line_gives_the_decide_rate_since_the_line_before():
    now = [0.0]
    counters = Counters()
    pool = _pool(SimpleNamespace(state="idle"), SimpleNamespace(state="starting"))
    line = StatusLine(SimpleNamespace(state="ready"), pool, RequestQueue(8), counters, lambda: now[0])
    now[0], counters.by_op["decide"] = 10.0, 20
    assert line() == "ready: 1/2 workers, queue 0/8, 2.0 decide/s, 20 decided"
    now[0], counters.by_op["decide"] = 20.0, 25
    assert line() == "ready: 1/2 workers, queue 0/8, 0.5 decide/s, 25 decided"


def _cache_settings(public_counters: bool):
    engine = SimpleNamespace(prefix_cache=64, prefix_cache_bytes=1 << 20, prefix_min_tokens=8)
    return SimpleNamespace(engine=engine, public_cache_counters=public_counters)


def test_the_cache_counters_reach_a_public_socket_only_where_the_operator_allows():
    worker = SimpleNamespace(stats={"prefix_cache": {"enabled": True, "size": 2, "hits": 5, "pinned_tokens": 4}})
    hidden = prefix_cache(_pool(worker), _cache_settings(public_counters=False), private=False)
    assert "hits" not in hidden and hidden["enabled"] and hidden["max_entries"] == 64
    shown = prefix_cache(_pool(worker), _cache_settings(public_counters=True), private=False)
    assert (shown["hits"], shown["size"], shown["cached_states"], shown["pinned_tokens"]) == (5, 2, 2, 4)
