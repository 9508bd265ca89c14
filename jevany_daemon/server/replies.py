"""Replies: each one counted (status counters, metrics), logged where --log-requests asks, and sent.

Every reply leaves through the outbox, to the connection that asked and
within its bounds (outbox.py). A decide reply, answer or error, carries the
daemon's load. What transport a request came by (ZeroMQ or the HTTP gateway)
keeps the two apart in the counts.
"""
import logging

from jevany_client.errors import JevanyError
from jevany_client.protocol import error_reply, ok_reply, pack

from jevany_daemon.logs import event

from .request_queue import Entry

log = logging.getLogger("jevany.supervisor")


class Replies:
    def __init__(self, *, counters, metrics, outbox, queue, pool, gather, clock, settings, gateway):
        self.counters, self.metrics, self.outbox = counters, metrics, outbox
        self.queue, self.pool, self.gather, self.clock = queue, pool, gather, clock
        self.settings = settings      # () -> ServeSettings: a reload replaces them
        self.gateway = gateway        # the HTTP gateway, with --http

    def transport(self, sock) -> str:
        """Where a request came from, for the counts that keep HTTP and ZeroMQ apart."""
        return "http" if self.gateway is not None and sock is self.gateway.sock else "zmq"

    def record(self, op: str | None, code: str | None, latency_s: float | None = None,
               transport: str = "zmq", before_ready: bool = False) -> None:
        self.counters.record(op, code, latency_s, transport, before_ready)
        self.metrics.reply(op, code, transport)
        if latency_s is not None:
            self.metrics.latency.observe(latency_s)

    # --- decide ------------------------------------------------------------

    def reply_ok(self, entry: Entry, result: dict) -> None:
        # Only workers answer with results; the gather heard of it already (worker_events.note).
        latency = self.clock() - entry.received
        self.record("decide", None, latency, self.transport(entry.sock), entry.before_ready)
        if self.settings().log_requests:
            event(log, "request", id=entry.id, outcome="ok", ms=round(latency * 1000, 2))
        self.send(entry.sock, entry.envelope, self.with_load(ok_reply(entry.id, result)))

    def reply_error(self, entry: Entry, err: JevanyError, noted: bool = False) -> None:
        now = self.clock()
        if not noted:
            self.gather.answered(entry.client, now)
        self.record("decide", err.code, now - entry.received, self.transport(entry.sock), entry.before_ready)
        if self.settings().log_requests:
            event(log, "request", id=entry.id, outcome=err.code)
        self.send(entry.sock, entry.envelope, self.with_load(error_reply(entry.id, err)))

    def departed(self, entry: Entry) -> None:
        """A queued request whose client disconnected (or whose HTTP caller withdrew it): dropped unscored,
        with no reply (nobody would read it); counted apart from replies, so the outcomes still add up to
        the replies sent."""
        self.counters.departed += 1
        self.metrics.departed.inc()
        if self.settings().log_requests:
            event(log, "request", id=entry.id, outcome="departed", transport=entry.transport)

    def withdrawn_late(self) -> None:
        """An HTTP caller left after its request was handed to a worker: scored for nobody. Counted, as the
        work a departure still costs; the gateway drops the answer."""
        self.counters.withdrawn_late += 1

    def with_load(self, reply: dict) -> dict:
        """A decide reply carries this daemon's load (PROTOCOL.md, "load"): what clients routing
        over several daemons weigh, read here rather than asked for by a status call."""
        reply["load"] = {"queue": len(self.queue), "inflight": self.pool.inflight()}
        return reply

    # --- any op ------------------------------------------------------------

    def refuse(self, sock, envelope: list, op: str | None, rid, err: JevanyError) -> None:
        """An op refused before it ran; op None: a message that could not be read as one."""
        self.record(op, err.code, transport=self.transport(sock))
        if op == "decide" and self.settings().log_requests:
            # Refused before it was queued (overloaded, shutting_down, a bad body): still one line.
            event(log, "request", id=rid, outcome=err.code)
        reply = error_reply(rid, err)
        self.send(sock, envelope, self.with_load(reply) if op == "decide" else reply)

    def answer(self, sock, envelope: list, op: str, rid, result: dict) -> None:
        """An op answered at once."""
        self.record(op, None, transport=self.transport(sock))
        self.send(sock, envelope, ok_reply(rid, result))

    def cleared(self, done: list) -> None:
        """clear_cache's totals (cache_clears.py), each to its control client; counted when it began."""
        for (sock, envelope, rid), cleared in done:
            self.send(sock, envelope, ok_reply(rid, {"cleared": cleared}))

    def drained(self, waiters: list) -> None:
        """The drain op's answer, once nothing is left; counted when it began."""
        for sock, envelope, rid in waiters:
            self.send(sock, envelope, ok_reply(rid, {"state": "drained"}))

    def send(self, sock, envelope: list, reply: dict) -> None:
        self.outbox.send(sock, envelope, pack(reply))     # to the connection that asked, within its bounds
