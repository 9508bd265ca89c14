"""The status op: live counters (outcomes by code, latency percentiles), batching, workers.

Each figure is a function of the parts it reads (the pool, the settings, the
counters, ...); daemon_status reads them through a StatusView, which holds
just those parts. StatusLine is systemd's STATUS= line, with the decide rate
since the line before.

The prefix cache's counters (entries, bytes, hits, misses, evictions, tokens
reused) move when any client's state is found or kept, so on a public socket
they would tell one client what another sent. Public status and models show
only how the cache is set up; the control endpoint shows everything.
"""
from __future__ import annotations

import os
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from jevany_daemon.media.policy import MediaPolicy

if TYPE_CHECKING:      # pool.py imports this module (add_stats); these are only annotations
    from .request_queue import RequestQueue
    from .curve import ZapHandler
    from .fds import FdGuard
    from .gateway_handle import GatewayProcess
    from .gather import Gather
    from .inbox import Inbox
    from .media_checks import MediaChecks
    from .outbox import Outbox
    from .pool import WorkerPool
    from .reload import Reloads
    from .run_state import RunState
    from .settings import ServeSettings

LATENCY_WINDOW = 4096   # recent decide replies the percentiles are taken over
CACHE_SETUP = ("enabled", "max_entries", "max_bytes", "min_tokens", "min_state_tokens")   # prefix_cache fields anyone may see


class Counters:
    def __init__(self):
        self.ok = 0
        self.error = 0
        self.by_code: Counter = Counter()
        self.by_op: Counter = Counter()
        self.decide_by_transport: Counter = Counter({"zmq": 0, "http": 0})
        self.mixed_batches = 0     # forward passes that held HTTP and ZeroMQ requests together
        self._latency: deque = deque(maxlen=LATENCY_WINDOW)
        self.waited_for_load = 0   # decide replies to requests that came while the model loaded
        self.departed = 0          # decide requests dropped unscored, their client gone (Replies.departed)
        self.withdrawn_late = 0    # HTTP decide requests whose caller left while a worker held them

    def record(self, op: str | None, code: str | None, latency_s: float | None = None,
               transport: str = "zmq", before_ready: bool = False) -> None:
        self.by_op[op or "unreadable"] += 1
        if op == "decide":
            self.decide_by_transport[transport] += 1
        if code is None:
            self.ok += 1
        else:
            self.error += 1
            self.by_code[code] += 1
        if before_ready:
            # Their seconds are the model's load, not the daemon's pace: left out of the percentiles.
            self.waited_for_load += 1
        elif latency_s is not None:
            self._latency.append(latency_s * 1000)

    def requests(self) -> dict:
        return {"ok": self.ok, "error": self.error, "by_error_code": dict(self.by_code),
                "by_op": dict(self.by_op), "decide_by_transport": dict(self.decide_by_transport),
                "departed": self.departed, "withdrawn_late": self.withdrawn_late}

    def latency_ms(self) -> dict:
        ordered = sorted(self._latency)
        return {"p50": _percentile(ordered, 0.50), "p99": _percentile(ordered, 0.99), "samples": len(ordered),
                "waited_for_load": self.waited_for_load}


def _percentile(ordered: list, q: float) -> float:
    if not ordered:
        return 0.0
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def merge_batching(per_worker: list[dict], max_batch_size: int, max_packed_tokens: int) -> dict:
    """Sum the engines' batching statistics across workers."""
    histogram: Counter = Counter()
    batches = requests = non_finite = 0
    busy_s = 0.0
    for stats in per_worker:
        batches += stats.get("batches", 0)
        requests += stats.get("requests", 0)
        non_finite += stats.get("non_finite", 0)
        busy_s += stats.get("busy_s", 0.0)
        histogram.update({k: v for k, v in stats.get("batch_size_histogram", {}).items()})
    return {
        "max_batch_size": max_batch_size,
        "max_packed_tokens": max_packed_tokens,
        "batches": batches,
        "requests": requests,
        "mean_batch_size": round(requests / batches, 3) if batches else 0.0,
        "batch_size_histogram": dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
        "busy_s": round(busy_s, 3),
        "non_finite": non_finite,
    }


def add_stats(total: dict, stats: dict) -> None:
    """Fold one engine's batching statistics into a running total (a worker that is gone keeps counting)."""
    total["plan"] = add_plan_counts(total.get("plan"), stats.get("plan"))
    total["batches"] = total.get("batches", 0) + stats.get("batches", 0)
    total["requests"] = total.get("requests", 0) + stats.get("requests", 0)
    total["busy_s"] = total.get("busy_s", 0.0) + stats.get("busy_s", 0.0)
    total["non_finite"] = total.get("non_finite", 0) + stats.get("non_finite", 0)
    histogram = Counter(total.get("batch_size_histogram", {}))
    histogram.update(stats.get("batch_size_histogram", {}))
    total["batch_size_histogram"] = dict(histogram)


def add_plan_counts(total: dict | None, counts: dict | None) -> dict | None:
    """Two workers' shape-plan counts (replay.Counts) as one; None where neither has a plan."""
    if counts is None:
        return total
    if total is None:
        total = {"planned": 0, "eager": {}, "recompiles": 0}
    eager = Counter(total["eager"])
    eager.update(counts.get("eager", {}))
    return {"planned": total["planned"] + counts.get("planned", 0), "eager": dict(eager),
            "recompiles": total["recompiles"] + counts.get("recompiles", 0)}


def serving_model(pool) -> dict | None:
    """The model as the serving generation's first loaded worker describes it; None before one has."""
    return next((w.model for w in pool.serving() if w.model), None)


def plan_status(pool, settings) -> dict:
    """The shape plan as the serving workers run it (the first one's buckets: each has the same), and every
    worker's counts: passes run in a bucket, passes run as they came by why, recompiles while serving."""
    model = serving_model(pool) or {}
    plan = model.get("plan") or {}
    counts = None
    for stats in [w.stats or {} for w in pool.workers] + [pool.gone_stats]:
        counts = add_plan_counts(counts, stats.get("plan"))
    counts = counts or {"planned": 0, "eager": {}, "recompiles": 0}
    return {"runner": settings.engine.runner, **{k: plan.get(k) for k in ("buckets", "rows", "widths", "max_tokens",
                                                                          "cached", "warm_up_s", "captured")},
            **counts}


def batching(pool, settings) -> dict:
    engine = settings.engine
    return merge_batching([w.stats or {} for w in pool.workers] + [pool.gone_stats],
                          engine.max_batch_size, engine.max_packed_tokens)


def prefix_cache(pool, settings, private: bool = True) -> dict:
    """The serving workers' prefix caches, summed: each worker keeps its own; private: with the counters."""
    engine = settings.engine
    reports = [w.stats.get("prefix_cache") or {} for w in pool.serving() if w.stats]
    total = {k: sum(r.get(k, 0) for r in reports) for k in ("size", "bytes", "hits", "misses", "evictions",
                                                                 "reused_tokens")}
    total["pinned_tokens"] = max((r.get("pinned_tokens", 0) for r in reports), default=0)   # the same head in each
    # On only where a worker keeps one: a model the cache is not proven on keeps none, whatever the setting.
    enabled = engine.prefix_cache > 0 and (not reports or any(r.get("enabled") for r in reports))
    cache = {"enabled": enabled, **total, "max_entries": engine.prefix_cache,
             "max_bytes": engine.prefix_cache_bytes, "min_tokens": engine.prefix_min_tokens,
             # JevAny's names for two of these
             "cached_states": total["size"], "min_state_tokens": engine.prefix_min_tokens}
    if private or settings.public_cache_counters:
        return cache
    return {k: cache[k] for k in CACHE_SETUP}


def describe_model(pool, settings, private: bool = True) -> dict:
    """The serving generation's model as its workers describe it, else what the settings say.

    The device is named as the operator named it: a worker calls its GPU cuda:0 whichever it is.
    """
    serving = pool.serving()
    model = serving_model(pool)
    if model is None:
        s = settings
        return {"id": s.model_id or s.model or "tiny-demo", "source": s.model or "tiny-demo",
                "readout": s.readout or "", "layout": s.engine.layout, "device": ",".join(s.devices),
                "dtype": s.dtype or "auto", "random_weights": s.model is None}
    devices = list(dict.fromkeys(d for w in serving for d in w.device.split(",")))
    limits = {**(model.get("limits") or {}), **media_policy(settings).limits(model.get("media_types") or ())}
    return {**model, "device": ",".join(dict.fromkeys(w.device for w in serving)), "devices": devices,
            "device_map": settings.device_map, "limits": limits, "batching": batching(pool, settings),
            "prefix_cache": prefix_cache(pool, settings, private)}


def media_status(media) -> dict:
    if media is None:
        return {"enabled": False, "checking": 0, "checker_restarts": 0, "checker_pid": None}
    return {"enabled": True, "checking": media.pending(), "checker_restarts": media.restarts,
            "checker_pid": media.proc.pid if media.proc is not None else None}


def media_policy(s) -> MediaPolicy:
    return MediaPolicy(s.media_root, s.media_max_bytes, s.media_total_bytes, s.media_max_pixels,
                       s.media_max_video_frames)


def clients_status(fd_guard, inbox, outbox) -> dict:
    """Descriptors and peers (fds.py, peers.py), and what was refused or dropped to stay within bounds."""
    return {**fd_guard.describe(), "messages_refused": inbox.refused,
            "replies_dropped": dict(outbox.dropped_by_cause), **outbox.budget.describe()}


@dataclass(frozen=True)
class StatusView:
    """What the status op reads, and nothing more; built by the supervisor once start has opened it."""
    version: str
    run_state: RunState
    clock: Callable[[], float]
    settings: Callable[[], ServeSettings]     # read on each call: a reload replaces them
    counters: Counters
    gather: Gather
    queue: RequestQueue
    pool: WorkerPool
    reloads: Reloads
    metrics_url: str | None
    zap: ZapHandler | None
    fd_guard: FdGuard
    inbox: Inbox
    outbox: Outbox
    gateway: GatewayProcess | None
    media: MediaChecks | None

    def model(self, private: bool = True) -> dict:
        return describe_model(self.pool, self.settings(), private)

    def status(self, private: bool = True) -> dict:
        """private: for the control endpoint, with what one client must not learn of another's requests."""
        return daemon_status(self, private)


def daemon_status(view: StatusView, private: bool = True) -> dict:
    """The status op's result (PROTOCOL.md, "status result"); private: as the control endpoint sees it."""
    v, settings = view, view.settings()
    model = describe_model(v.pool, settings, private)
    return {
        "version": v.version,
        "pid": os.getpid(),
        "uptime_s": round(v.clock() - v.run_state.started, 3),
        "state": v.run_state.state,
        "serving": workers_up(v.pool) > 0,
        "endpoints": list(settings.endpoints),
        "control_endpoint": settings.control_endpoint,
        "max_message_bytes": settings.max_message_bytes,
        "metrics": v.metrics_url,
        "curve": v.zap is not None,
        "model": {k: model.get(k) for k in ("id", "source", "readout", "layout", "device", "dtype",
                                             "random_weights")},
        "batching": {**batching(v.pool, settings), "mixed_transport_batches": v.counters.mixed_batches,
                     "gather": v.gather.as_dict()},
        "prefix_cache": prefix_cache(v.pool, settings, private),
        "plan": plan_status(v.pool, settings),
        "queue": {"depth": len(v.queue), "max_depth": v.queue.max_depth},
        "clients": clients_status(v.fd_guard, v.inbox, v.outbox),
        "workers": v.pool.describe(),
        "reload": v.reloads.describe(),
        "requests": v.counters.requests(),
        "http": v.gateway.describe() if v.gateway is not None else None,
        "media": media_status(v.media),
        "latency_ms": v.counters.latency_ms(),
    }


class StatusLine:
    """systemd's STATUS=: workers up, queue depth, decide replies per second since the last line."""

    def __init__(self, run_state: RunState, pool, queue, counters: Counters, clock):
        self.run_state, self.pool, self.queue, self.counters, self.clock = run_state, pool, queue, counters, clock
        self._decided_at_report = (0, clock())

    def __call__(self) -> str:
        decided, now = self.counters.by_op["decide"], self.clock()
        before, since = self._decided_at_report
        self._decided_at_report = (decided, now)
        return status_line(self.run_state.state, self.pool, self.queue, self.counters,
                           (decided - before) / max(now - since, 1e-9))


def workers_up(pool) -> int:
    """Serving workers that can take requests now (not starting, not stopping: a replacement loads)."""
    return sum(w.state in ("idle", "busy") for w in pool.serving())


def status_line(state: str, pool, queue, counters: Counters, decide_per_s: float) -> str:
    serving = pool.serving()
    up = workers_up(pool)
    return (f"{state}: {up}/{len(serving)} workers, queue {len(queue)}/{queue.max_depth}, "
            f"{decide_per_s:.1f} decide/s, {counters.by_op['decide']} decided")
