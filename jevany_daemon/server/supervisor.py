"""The supervisor: one loop that owns the public sockets, the queue and the workers.

Each turn of the loop runs the same phases, in order:

    wait → handle signals → authenticate → receive from clients (a time budget, inbox.py)
         → receive from workers → expire deadlines → dispatch to idle workers → send answers
         → watch workers (their messages read first) → watch their pace (pace.py)
         → guard descriptors (fds.py)
         → advance a reload → finish a drain → report (systemd, metrics, throttled logs)

The phases are here; what they hand on has rooms of its own beside the loop:
each client message and its op (client_ops.py), each worker message and exit
(worker_events.py), a reload (reload.py), the status op's figures (status.py),
each reply counted and sent (replies.py), where the run stands (run_state.py),
and what the loop runs on, opened before its first turn and closed after its
last (lifecycle.py). Each is handed the parts it uses, never the supervisor:
what one helper needs of another it is given directly, so what each depends
on can be read from its constructor.

Every message a client sends gets exactly one reply: an answer, or a typed
error (invalid_message, overloaded, deadline_exceeded, shutting_down,
worker_lost, ...). No torch here; only the worker processes hold the model.

Signals (SIGTERM, SIGINT: drain and exit; SIGHUP: reload) only set flags
(signals.py); the handle-signals phase acts on them.
"""
import logging
import os
import signal
import time

import zmq

from jevany_client.calls import has_message
from jevany_client.errors import DeadlineExceededError, ShuttingDownError

from jevany_daemon import __version__
from jevany_daemon import channel
from jevany_daemon.logs import RateLimited, event

from . import lifecycle
from .cache_clears import CacheClears
from .client_ops import ClientOps
from .gather import Gather
from .metrics import Metrics
from .pace import PaceWatch
from .peers import UNWATCHED
from .reload import Reloads
from .replies import Replies
from .request_queue import RequestQueue
from .run_state import DRAINING, READY, STARTING, RunState
from .sdnotify import Notifier
from .settings import ServeSettings
from .sockets import StartupError     # raised by run(); the command line catches it from here
from .status import Counters, StatusLine, StatusView, plan_status, prefix_cache
from .worker_events import WorkerEvents

log = logging.getLogger("jevany.supervisor")

RECEIVE_BURST = 1000      # worker messages taken per turn (client messages: a time budget, inbox.py)
IDLE_WAIT_MS = 200        # longest sleep in poll; bounds how late a hang or a report is noticed
REPORT_EVERY_S = 2.0      # how often the systemd STATUS= line is renewed
OVERLOAD_LOG_EVERY_S = 10.0


class Supervisor:
    def __init__(self, settings: ServeSettings, clock=time.monotonic, reload_settings=None, env=os.environ):
        self.settings = settings           # replaced when a reload switches (reload.py)
        self.clock = clock
        self.fresh_settings = reload_settings or (lambda: settings)
        self.queue = RequestQueue(settings.max_queue)
        self.counters = Counters()
        self.metrics = Metrics()
        self.notifier = Notifier(env)
        self.overloads = RateLimited(log, "overload", OVERLOAD_LOG_EVERY_S, clock, level=logging.WARNING)
        self.run_state = RunState(started=clock())
        self.clears = CacheClears()        # control clients awaiting clear_cache's count
        self.gather = Gather()             # when a free worker waits for answered clients (GPU-aware)
        self.pace_watch = PaceWatch(self.metrics)    # each serving worker's pace against its own best
        self.wiring: lifecycle.Wiring | None = None     # what the loop runs on, once started
        self._gather_until: float | None = None
        self._next_report = self._next_watchdog = clock()

    # --- lifecycle -------------------------------------------------------

    def run(self) -> int:
        try:
            self.wiring = lifecycle.start(self.settings, self.clock, self.metrics, self.busy_fds)
            self._assemble(self.wiring)
            while not self.run_state.done:
                self.tick()
        except StartupError as exc:
            self.run_state.fail(str(exc))     # what the stop event reports, and the exit status
            raise
        finally:
            if self.wiring is not None:
                lifecycle.close(self.wiring)
            lifecycle.end(self.metrics, self.notifier, self.run_state.exit_code, self.run_state.failure)
        return self.run_state.exit_code

    def _assemble(self, w: lifecycle.Wiring) -> None:
        """The helpers, each handed the parts it uses; what reads the settings gets a getter (reloads)."""
        settings = self._current_settings
        self.replies = Replies(counters=self.counters, metrics=self.metrics, outbox=w.outbox, queue=self.queue,
                               pool=w.pool, gather=self.gather, clock=self.clock, settings=settings,
                               gateway=w.gateway)
        self.status_line = StatusLine(self.run_state, w.pool, self.queue, self.counters, self.clock)
        self.reloads = Reloads(fresh_settings=self.fresh_settings, settings=settings, run_state=self.run_state,
                               pool=w.pool, zap=w.zap, clock=self.clock, notifier=self.notifier,
                               metrics=self.metrics, replies=self.replies, status_line=self.status_line)
        self.status = StatusView(version=__version__, run_state=self.run_state, clock=self.clock, settings=settings,
                                 counters=self.counters, gather=self.gather, queue=self.queue, pool=w.pool,
                                 reloads=self.reloads, metrics_url=w.metrics_url, zap=w.zap, fd_guard=w.fd_guard,
                                 inbox=w.inbox, outbox=w.outbox, gateway=w.gateway, media=w.media)
        self.ops = ClientOps(clock=self.clock, run_state=self.run_state, queue=self.queue, media=w.media,
                             gather=self.gather, overloads=self.overloads, pool=w.pool, clears=self.clears,
                             reloads=self.reloads, control=w.control, replies=self.replies, status=self.status,
                             begin_drain=self.begin_drain)
        self.events = WorkerEvents(pool=w.pool, run_state=self.run_state, settings=settings, clock=self.clock,
                                   gather=self.gather, counters=self.counters, metrics=self.metrics,
                                   notifier=self.notifier, status_line=self.status_line, replies=self.replies,
                                   clears=self.clears, reloads=self.reloads, fail=self.fail)

    def _current_settings(self) -> ServeSettings:
        return self.settings

    def tick(self) -> None:
        ready = self.wait()
        self.handle_signals()
        self.authenticate(ready)
        self.receive_clients()
        self.receive_media(ready)
        self.receive_workers()
        self.expire_deadlines()
        self.dispatch()
        self.send_answers()
        self.watch_workers()
        self.watch_pace()
        self.guard_fds()
        self.advance_reload()
        self.finish_drain()
        self.report()

    # --- phases ----------------------------------------------------------

    def wait(self) -> dict:
        w, now = self.wiring, self.clock()
        timeout = IDLE_WAIT_MS
        deadline = self.queue.next_deadline()
        if deadline is not None:
            timeout = min(timeout, int((deadline - now) * 1000) + 1)
        if self.notifier.watchdog_s is not None:
            timeout = min(timeout, int((self._next_watchdog - now) * 1000) + 1)
        if w.gateway is not None and (restart_in := w.gateway.wait_s()) is not None:
            timeout = min(timeout, int(restart_in * 1000) + 1)
        if w.media is not None and (due := w.media.next_deadline()) is not None:
            timeout = min(timeout, int((due - now) * 1000) + 1)
        if self._gather_until is not None:
            timeout = min(timeout, max(0, int((self._gather_until - now) * 1000) + 1))
        return dict(w.poller.poll(max(0, timeout)))

    def handle_signals(self) -> None:
        for signum in self.wiring.signals.take():
            if signum == signal.SIGHUP:
                self.reloads.begin(cause="SIGHUP")
                continue
            if self.run_state.stopping:
                self.run_state.stop_now()     # a second signal: stop without waiting for the queue
            self.begin_drain(exiting=True, cause=signal.Signals(signum).name)

    def authenticate(self, ready: dict) -> None:
        zap = self.wiring.zap
        if zap is not None and zap.sock in ready:
            zap.handle()

    def receive_clients(self) -> None:
        # Every client socket, whatever poll saw: a turn cut short by the budget left some waiting.
        self.wiring.peers.read()
        self.wiring.inbox.take(self.wiring.client_sockets(), self.ops.handle)

    def receive_media(self, ready: dict) -> None:
        if self.wiring.media is not None:
            for entry, ok, outcome in self.wiring.media.receive(ready):
                self.ops.media_checked(entry, ok, outcome)

    def receive_workers(self) -> None:
        # Whatever poll saw: after a long turn, heartbeats wait here that poll knew nothing of.
        backend, pool = self.wiring.backend, self.wiring.pool
        for _ in range(RECEIVE_BURST):
            if not has_message(backend):
                break
            try:
                ident, payload = backend.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:
                continue   # not a worker's two-frame message; nothing else can reach this ipc path
            worker = pool.find(ident)
            if worker is not None:
                worker.last_seen = self.clock()
                self.events.handle(worker, channel.decode(payload))

    def expire_deadlines(self) -> None:
        now, media = self.clock(), self.wiring.media
        expired = self.queue.take_expired(now) + (media.take_expired(now) if media is not None else [])
        for entry in expired:
            self.replies.reply_error(entry, DeadlineExceededError("timeout_ms passed before scoring began"))

    def dispatch(self) -> None:
        """Hand the queue to free workers, and a full pass's worth to busy ones that can take it.

        A free worker waits, briefly and only where the workers' measured pass
        costs justify it, for clients just answered to come back (gather.py).
        A busy one takes more only when a full pass is queued: it admits it
        while the device runs and launches it the moment the device is free.
        Anything less waits for the worker to be free and takes whatever came
        meanwhile, so a pass is never launched half empty with more queued.
        """
        now, full = self.clock(), self.settings.engine.max_batch_size
        self._gather_until = None
        for worker in self.wiring.pool.serving():
            if not len(self.queue):
                return
            if worker.available:
                until = self.gather.hold_until(len(self.queue), full, now)
                if until is not None:
                    self._gather_until = until if self._gather_until is None else min(self._gather_until, until)
                    continue
            elif not (worker.can_prefetch and len(self.queue) >= full):
                continue
            entries = self.take_live(full)
            if not entries:
                return
            for entry in entries:
                self.metrics.queue_wait.observe(now - entry.received)
            worker.hand_over(self.wiring.backend, entries, now)

    def take_live(self, n: int) -> list:
        """Up to n queued requests, dropping unscored those whose ZeroMQ client has disconnected: the
        protocol owes it no reply, and scoring it would only make the live clients wait. One whose
        connection cannot be told (the gateway's, an unwatched socket) counts as live."""
        peers, live = self.wiring.peers, []
        peers.read()          # a departure libzmq has reported is known before anything is handed over
        while len(live) < n and len(self.queue):
            for entry in self.queue.take(n - len(live)):
                if peers.alive(getattr(entry.envelope, "peer", UNWATCHED)):
                    live.append(entry)
                else:
                    self.replies.departed(entry)
        return live

    def send_answers(self) -> None:
        """Reply to what workers answered this tick. After dispatch, so a worker that just freed
        takes the queue at once instead of idling while dozens of replies are sent."""
        for entry, ok, outcome in self.events.take_answered():
            if ok:
                self.replies.reply_ok(entry, outcome)
            else:
                self.replies.reply_error(entry, outcome, noted=True)

    def watch_workers(self) -> None:
        w = self.wiring
        self.receive_workers()     # a worker is judged on everything it has said, not on what poll saw
        for worker, cause in w.pool.hung():
            event(log, "worker_hung", level=logging.WARNING, index=worker.slot, pid=worker.pid, cause=cause)
            worker.kill(cause)
        for worker in w.pool.exited():
            self.events.on_exit(worker)
        w.pool.retire_idle()
        if w.media is not None:
            self.receive_media(None)      # likewise a check that finished is not judged overdue
            for entry, ok, outcome in w.media.watch():
                self.ops.media_checked(entry, ok, outcome)
        if w.gateway is not None:
            # While stopping, one that exits is reaped but not started again.
            w.gateway.watch(restart=not self.run_state.stopping)

    def watch_pace(self) -> None:
        may_replace = (self.settings.replace_slow_workers and self.reloads.current is None
                       and self.run_state.state == READY)
        cause = self.pace_watch.check(self.wiring.pool.serving(), self.clock(), may_replace)
        if cause is not None:
            self.reloads.begin(cause, same_settings=True)

    def guard_fds(self) -> None:
        self.wiring.peers.read()
        self.wiring.fd_guard.check()

    def busy_fds(self) -> set:
        """Descriptors of peers holding a request: never closed for being idle."""
        w = self.wiring
        entries = list(self.queue) + [e for worker in w.pool.workers for e in worker.inflight.values()]
        if w.media is not None:
            entries += w.media.entries()
        return {e.envelope.peer.fd for e in entries if getattr(e.envelope, "peer", None) is not None}

    def advance_reload(self) -> None:
        settings = self.reloads.advance()
        if settings is not None:
            self.settings = settings      # what every part's settings getter reads from now on

    def finish_drain(self) -> None:
        run, media = self.run_state, self.wiring.media
        if run.state != DRAINING:
            return
        if run.stopping_now:
            waiting = self.queue.take_all() + (media.close_waiting() if media is not None else [])
            for entry in waiting:
                self.replies.reply_error(entry, ShuttingDownError("the daemon stopped before scoring this request"))
        if len(self.queue) or self.wiring.pool.inflight() or (media is not None and media.pending()):
            return
        self.replies.drained(run.drained())

    def report(self) -> None:
        w, now = self.wiring, self.clock()
        if w.metrics_url is not None:     # a few label lookups per tick, on every request's path
            self.metrics.gauges(len(self.queue), self.queue.max_depth, w.pool.inflight(),
                                [worker.state for worker in w.pool.workers], self.run_state.state == READY)
            self.metrics.prefix_cache_stats(prefix_cache(w.pool, self.settings))
            self.metrics.plan_stats(plan_status(w.pool, self.settings))
            self.metrics.descriptors(w.fd_guard.describe())
        self.overloads.flush()
        w.outbox.dropped.flush()
        if self.notifier.watchdog_s is not None and now >= self._next_watchdog:
            self.notifier.watchdog()
            self._next_watchdog = now + self.notifier.watchdog_s
        if now >= self._next_report:
            self._next_report = now + REPORT_EVERY_S
            self.notifier.status(self.status_line())     # while loading too: "starting: 1/2 workers"
            w.outbox.forget_gone()

    # --- stopping --------------------------------------------------------

    def begin_drain(self, exiting: bool, cause: str) -> None:
        if not self.run_state.winding_down:
            event(log, "drain", cause=cause, queued=len(self.queue), inflight=self.wiring.pool.inflight())
            self.notifier.stopping(f"draining: {cause}")
            self.reloads.cancel("the daemon began draining")
        self.run_state.begin_drain(exiting)

    def fail(self, message: str, exit_code: int = 1) -> None:
        """Stop the daemon: nothing can serve (a model that will not load; exit 2: settings that cannot work)."""
        failure = self.run_state.fail(message, exit_code)
        event(log, "startup_failed" if self.run_state.state == STARTING else "failed", level=logging.ERROR,
              error=failure)
        self.begin_drain(exiting=True, cause="worker failed to start")
        self.run_state.stop_now()
