"""Prometheus metrics, served on --metrics-host (127.0.0.1) when --metrics-port is given.

The supervisor updates them from its loop; the metrics server's one thread
(metrics_http.py) only reads them. Batch facts (size, padded tokens, forward-pass time) come
from the workers' results messages, so scoring is measured where it happens.
"""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from jevany_daemon.channel import PassRecord

from .metrics_http import MetricsServer

_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKENS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WORKER_STATES = ("starting", "idle", "busy", "stopping")


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("jevany_requests", "Replies sent, by op, outcome (ok or the error code) and "
                                "transport (zmq, or http through the gateway).",
                                ["op", "outcome", "transport"], registry=r)
        self.departed = Counter("jevany_requests_departed", "decide requests dropped from the queue unscored: "
                                "their ZeroMQ client had disconnected, or their HTTP caller "
                                "closed its connection, so nobody would read the answer.",
                                registry=r)
        self.pace_ratio = Gauge("jevany_worker_pace_ratio", "Each serving worker's recent ms per padded token "
                                "over its own best at the same pass shape: 1 at its best (NaN: not measured).",
                                ["worker"], registry=r)
        self.slow_workers = Counter("jevany_workers_slow", "Times a worker ran at least twice as slow as its own "
                                    "best for a minute (log event worker_slow).", registry=r)
        self.mixed_batches = Counter("jevany_mixed_transport_batches", "Forward passes that held both HTTP and "
                                     "ZeroMQ requests.", registry=r)
        self.queue_depth = Gauge("jevany_queue_depth", "decide requests waiting for a worker.", registry=r)
        self.queue_max = Gauge("jevany_queue_max_depth", "The queue bound (--max-queue).", registry=r)
        self.inflight = Gauge("jevany_inflight_requests", "Requests handed to workers, not yet answered.",
                              registry=r)
        self.batch_size = Histogram("jevany_batch_size", "Requests per forward pass.", buckets=_SIZES, registry=r)
        self.padded_tokens = Histogram("jevany_batch_padded_tokens", "Padded tokens per forward pass.",
                                       buckets=_TOKENS, registry=r)
        self.tokens = Counter("jevany_tokens", "Tokens through forward passes; padded minus real is waste.",
                              ["kind"], registry=r)
        self.queue_wait = Histogram("jevany_queue_wait_seconds", "decide: received until handed to a worker.",
                                    buckets=_SECONDS, registry=r)
        self.scoring = Histogram("jevany_scoring_seconds", "One forward pass, measured in the worker.",
                                 buckets=_SECONDS, registry=r)
        self.latency = Histogram("jevany_request_latency_seconds", "decide: received until replied.",
                                 buckets=_SECONDS, registry=r)
        self.restarts = Counter("jevany_worker_restarts", "Workers replaced after dying or hanging.", ["cause"],
                                registry=r)
        self.workers = Gauge("jevany_workers", "Worker processes by state.", ["state"], registry=r)
        self.reloads = Counter("jevany_reloads", "Reloads, by result.", ["result"], registry=r)
        self.ready = Gauge("jevany_ready", "1 while the daemon serves, 0 while starting or draining.", registry=r)
        # Gauges, not counters: the serving workers' own counts, which start again with a new worker.
        self.prefix_cache = Gauge("jevany_prefix_cache", "The serving workers' prefix caches, summed: entries, "
                                  "bytes held, hits, misses, evictions and tokens not computed again.", ["what"], registry=r)
        self.plan_passes = Gauge("jevany_plan_passes", "Forward passes of the workers so far, by how they ran: "
                                 "planned (in a bucket of the shape plan), or eager and why (shape, layout, "
                                 "readouts, media, blend); recompiles: compiled passes that ran eagerly instead "
                                 "of compiling again.", ["path"], registry=r)
        self.model = Info("jevany_model", "The model being served.", registry=r)
        self.fds = Gauge("jevany_open_fds", "File descriptors the supervisor holds.", registry=r)
        self.max_fds = Gauge("jevany_max_fds", "The supervisor's descriptor limit (RLIMIT_NOFILE, raised to the "
                             "hard limit at start).", registry=r)
        self.peers = Gauge("jevany_client_connections", "Clients connected to the public and control "
                           "endpoints.", registry=r)
        self.refusing = Gauge("jevany_refusing_new_clients", "1 while descriptors run short and the public "
                              "endpoints take no new clients.", registry=r)
        for cause in ("died", "hung"):
            self.restarts.labels(cause)       # series exist at 0, so a rate() has a start
        for result in ("ok", "failed", "refused"):
            self.reloads.labels(result)
        self._server = None

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint; returns the port (useful when 0 asked for any)."""
        self._server = MetricsServer(self.registry, host, port)
        return self._server.port

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def reply(self, op: str | None, code: str | None, transport: str = "zmq") -> None:
        self.requests.labels(op or "unreadable", code or "ok", transport).inc()

    def pace(self, slot: int, ratio: float | None) -> None:
        self.pace_ratio.labels(str(slot)).set(float("nan") if ratio is None else ratio)

    def batches(self, records: list) -> None:
        """records: a worker's passes (channel.PassRecord), sent with its results."""
        for record in map(PassRecord.read, records):
            if len(record.origins) > 1:
                self.mixed_batches.inc()
            self.batch_size.observe(record.size)
            self.padded_tokens.observe(record.padded_tokens)
            self.tokens.labels("padded").inc(record.padded_tokens)
            self.tokens.labels("real").inc(record.real_tokens)
            self.scoring.observe(record.latency_ms / 1000)

    def gauges(self, queue_depth: int, queue_max: int, inflight: int, worker_states: list[str], ready: bool):
        self.queue_depth.set(queue_depth)
        self.queue_max.set(queue_max)
        self.inflight.set(inflight)
        for state in WORKER_STATES:
            self.workers.labels(state).set(worker_states.count(state))
        self.ready.set(1 if ready else 0)

    def prefix_cache_stats(self, stats: dict) -> None:
        for what in ("size", "bytes", "hits", "misses", "evictions", "reused_tokens"):
            self.prefix_cache.labels(what).set(stats.get(what, 0))

    def plan_stats(self, plan: dict) -> None:
        if not plan.get("runner"):
            return
        self.plan_passes.labels("planned").set(plan.get("planned", 0))
        self.plan_passes.labels("recompiles").set(plan.get("recompiles", 0))
        for reason, n in (plan.get("eager") or {}).items():
            self.plan_passes.labels(f"eager_{reason}").set(n)

    def descriptors(self, fds: dict) -> None:
        self.fds.set(fds["open"])
        self.max_fds.set(fds["limit"])
        self.peers.set(fds["connected"])
        self.refusing.set(1 if fds["refusing_new_peers"] else 0)

    def describe_model(self, model: dict) -> None:
        self.model.info({k: str(model.get(k, "")) for k in ("id", "source", "readout", "layout", "device", "dtype")})
