"""Prometheus metrics as the supervisor feeds them from a worker's pass records (no daemon, no server)."""
from jevany_daemon.channel import PassRecord
from jevany_daemon.server.metrics import Metrics


def test_a_pass_record_moves_the_batch_series_in_their_units():
    metrics = Metrics()
    metrics.batches([list(PassRecord(size=2, padded_tokens=10, real_tokens=8, latency_ms=5.0, ok=True,
                                     origins=["zmq"])),
                     list(PassRecord(size=3, padded_tokens=6, real_tokens=6, latency_ms=20.0, ok=True,
                                     origins=["zmq", "http"]))])
    value = metrics.registry.get_sample_value
    assert value("jevany_scoring_seconds_sum") == 0.025         # milliseconds from the worker, seconds here
    assert value("jevany_batch_size_sum") == 5 and value("jevany_batch_size_count") == 2
    assert value("jevany_tokens_total", {"kind": "padded"}) == 16
    assert value("jevany_tokens_total", {"kind": "real"}) == 14
    assert value("jevany_mixed_transport_batches_total") == 1   # only the pass that held both transports


def test_replies_are_counted_by_op_outcome_and_transport():
    metrics = Metrics()
    metrics.reply("decide", None, "http")
    metrics.reply(None, "invalid_message")
    value = metrics.registry.get_sample_value
    assert value("jevany_requests_total", {"op": "decide", "outcome": "ok", "transport": "http"}) == 1
    assert value("jevany_requests_total", {"op": "unreadable", "outcome": "invalid_message", "transport": "zmq"}) == 1


def test_the_worker_gauges_count_each_state_and_ready_is_one_or_zero():
    metrics = Metrics()
    metrics.gauges(queue_depth=3, queue_max=10, inflight=2, worker_states=["idle", "busy", "busy"], ready=True)
    value = metrics.registry.get_sample_value
    assert [value("jevany_workers", {"state": s}) for s in ("starting", "idle", "busy", "stopping")] == [0, 1, 2, 0]
    assert (value("jevany_queue_depth"), value("jevany_queue_max_depth"), value("jevany_ready")) == (3, 10, 1)
