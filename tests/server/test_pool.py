"""Two workers on one queue: both take batches, both show in status, answers as from one; metrics move."""
import os
import shutil
import signal
import tempfile
import urllib.request
from pathlib import Path

import msgpack
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from jevany_client import InvalidRequestError, ShuttingDownError
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.parity import answer_problems, compare

from .daemons import Daemon, wait_for


@pytest.fixture(scope="module")
def pool(tiny_model):
    d = Daemon(Path(tempfile.mkdtemp(prefix="jvd-")), tiny_model("qwen3", "pointer"),
               "--workers", "2", "--max-batch-size", "4", "--metrics-port", "0",
               "--heartbeat-timeout", "300")    # the metrics test stops the workers for a while
    try:
        d.wait_ready()
        yield d
    finally:
        if d.proc.poll() is None:
            d.stop()
        shutil.rmtree(d.dir, ignore_errors=True)


def scrape(daemon) -> dict:
    """{(name, labels as a sorted tuple): value} from the daemon's metrics endpoint."""
    with urllib.request.urlopen(daemon.status()["metrics"], timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _held(metrics: dict) -> tuple:
    return metrics[("jevany_queue_depth", ())], metrics[("jevany_inflight_requests", ())]


def test_two_workers_both_take_batches_and_answer_like_one(pool, loaded_model):
    bodies = workloads.short(40, seed=17)
    with pool.client(timeout=120) as client:
        results = client.decide_many(bodies)
    status = pool.status()
    workers = status["workers"]
    assert [w["index"] for w in workers] == [0, 1] and len({w["pid"] for w in workers}) == 2
    assert all(w["requests"] > 0 for w in workers), workers     # group commit across the pool
    assert sum(w["requests"] for w in workers) >= len(bodies)
    from jevany_daemon.engine.engine import Engine

    engine = Engine(loaded_model("qwen3", "pointer"), EngineConfig())
    report = compare([engine.decide(b) for b in bodies], results)
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == []
    assert [p for body, r in zip(bodies, results) for p in answer_problems(body, r)] == []


def test_metrics_serve_the_listed_series_and_move_under_load(pool):
    before = scrape(pool)
    bodies = workloads.short(96, seed=3)
    # The workers are stopped (SIGSTOP) while the requests arrive, so the queue and the
    # in-flight gauges surely show them, whenever the scrape comes.
    stopped = [w["pid"] for w in pool.workers()]
    ctx = zmq.Context()
    try:
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(pool.endpoint)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            for i, body in enumerate(bodies):
                raw.send(msgpack.packb({"v": 1, "id": i, "op": "decide", "body": body}))
            # Each worker took up to 4 at a dispatch; how many depends on how many had arrived by
            # then (one turn of the loop may see only the first request), never on a worker freeing.
            wait_for(lambda: (held := _held(scrape(pool)))[0] + held[1] == len(bodies) and 2 <= held[1] <= 8,
                     60, "every request shown queued or held by the stopped workers (1 to 4 each)")
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        replies = [msgpack.unpackb(raw.recv()) for _ in bodies if raw.poll(120_000)]
    finally:
        ctx.destroy(linger=0)
    assert sorted(r["id"] for r in replies) == list(range(len(bodies))) and all(r["ok"] for r in replies)
    with pool.client(timeout=120) as client, pytest.raises(InvalidRequestError):
        client.call("decide", {"state": "s", "questions": {}})
    after = scrape(pool)

    def moved(name, labels=()):
        key = (name, tuple(sorted(labels)))
        return after.get(key, 0) - before.get(key, 0)

    assert moved("jevany_requests_total", {"op": "decide", "outcome": "ok", "transport": "zmq"}.items()) == 96
    assert moved("jevany_requests_total", {"op": "decide", "outcome": "invalid_request", "transport": "zmq"}.items()) == 1
    assert moved("jevany_requests_total", {"op": "status", "outcome": "ok", "transport": "zmq"}.items()) >= 1
    assert moved("jevany_batch_size_count") >= 96 / 4
    assert moved("jevany_batch_size_sum") == 96
    assert moved("jevany_batch_padded_tokens_sum") > 0
    assert moved("jevany_queue_wait_seconds_count") == 96
    assert moved("jevany_scoring_seconds_count") == moved("jevany_batch_size_count")
    assert moved("jevany_request_latency_seconds_count") == 96     # queued ones; the invalid one never was
    assert moved("jevany_tokens_total", {"kind": "real"}.items()) > 0
    assert after[("jevany_workers", (("state", "idle"),))] == 2
    assert after[("jevany_ready", ())] == 1 and after[("jevany_queue_max_depth", ())] == 1024
    info = [labels for (name, labels) in after if name == "jevany_model_info"]
    assert info and dict(info[0])["readout"] == "pointer" and dict(info[0])["device"] == "cpu"
    assert after[("jevany_worker_restarts_total", (("cause", "died"),))] == 0
    assert after[("jevany_reloads_total", (("result", "ok"),))] == 0


def test_drain_with_two_workers_answers_everything_first(pool):
    # Last in this module: the pool daemon takes no work after it.
    ctx = zmq.Context()
    try:
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(pool.endpoint)
        for i, body in enumerate(workloads.short(24, seed=12)):
            raw.send(msgpack.packb({"v": 1, "id": i, "op": "decide", "body": body}))
        wait_for(lambda: pool.status()["queue"]["depth"] + sum(w["inflight"] for w in pool.workers()) > 0
                 or raw.poll(0), 60, "work accepted")
        with pool.control_client(timeout=120) as control:
            assert control.drain() == {"state": "drained"}
        status = pool.status()
        replies = []
        while len(replies) < 24 and raw.poll(30_000):
            replies.append(msgpack.unpackb(raw.recv()))
    finally:
        ctx.destroy(linger=0)
    assert sorted(r["id"] for r in replies) == list(range(24)) and all(r["ok"] for r in replies)
    assert status["queue"]["depth"] == 0 and all(w["inflight"] == 0 for w in status["workers"])
    with pool.client(timeout=30, retries=0) as client, pytest.raises(ShuttingDownError):
        client.call("decide", workloads.short(1, seed=1)[0])
    assert pool.status()["state"] == "drained"


def test_a_removed_workers_batching_totals_still_count_in_the_daemons():
    # Status and the metrics' counters are totals since start: a worker that exits (died, hung, retired by a
    # reload) must not take its batches with it, or the counters go backwards and rates read as resets.
    from types import SimpleNamespace

    from jevany_daemon.server.pool import WorkerPool
    from jevany_daemon.server.settings import ServeSettings
    from jevany_daemon.server.status import batching
    from jevany_daemon.server.worker_handle import IDLE, WorkerHandle

    def worker(serial, stats):
        return WorkerHandle(0, serial, 0, SimpleNamespace(pid=serial), "cpu", heartbeat_timeout=10.0,
                            batch_timeout=120.0, spawned_at=0.0, state=IDLE, stats=stats)

    workers = WorkerPool(None, "", zmq.Poller(), lambda: 0.0)
    dead = worker(1, {"batches": 3, "requests": 7, "busy_s": 1.5, "batch_size_histogram": {"2": 2, "3": 1}})
    successor = worker(2, {"batches": 1, "requests": 2, "busy_s": 0.5, "batch_size_histogram": {"2": 1}})
    workers.workers += [dead, successor]
    workers.remove(dead)
    assert workers.workers == [successor]
    totals = batching(workers, ServeSettings())
    assert (totals["batches"], totals["requests"], totals["busy_s"]) == (4, 9, 2.0)
    assert totals["batch_size_histogram"] == {"2": 3, "3": 1}


def test_during_a_reload_the_serving_generation_is_neither_incoming_nor_retiring():
    from types import SimpleNamespace

    from jevany_daemon.server.pool import WorkerPool

    workers = WorkerPool(None, "", zmq.Poller(), lambda: 0.0)
    old, serving, new = (SimpleNamespace(generation=g, inflight=[]) for g in (0, 1, 2))
    workers.workers += [old, serving, new]
    workers.switch_to(1)
    assert (workers.retiring(), workers.serving(), workers.incoming()) == ([old], [serving], [new])
    assert [workers.role(w) for w in (old, serving, new)] == ["retiring", "serving", "incoming"]
