"""The supervisor: one loop that owns the public sockets, the queue and the workers.

Each turn of the loop runs the same phases, in order:

    wait → handle signals → authenticate → receive from clients (a time budget, inbox.py)
         → receive from workers → expire deadlines → dispatch to idle workers → send answers
         → watch workers (their messages read first) → guard descriptors (fds.py)
         → advance a reload → finish a drain → report (systemd, metrics, throttled logs)

Every message a client sends gets exactly one reply: an answer, or a typed
error (invalid_message, overloaded, deadline_exceeded, shutting_down,
worker_lost, ...). No torch here; only the worker processes hold the model.

Signals (SIGTERM, SIGINT: drain and exit; SIGHUP: reload) only set flags
(signals.py); the handle-signals phase acts on them.
"""
import logging
import os
import shutil
import signal
import tempfile
import time
from itertools import count

import zmq

from jevany_client.errors import (
    ForbiddenError,
    InternalError,
    InvalidRequestError,
    JevanyError,
    OverloadedError,
    DeadlineExceededError,
    ShuttingDownError,
    WorkerLostError,
    error_from_wire,
)
from jevany_client.protocol import CONTROL_OPS, decode_request, error_reply, ok_reply, pack
from jevany_client.schema import parse_decision

from jevany_daemon import __version__

from . import channel, curve, fds
from .admission import Entry, RequestQueue
from .cache_clears import CacheClears
from .gateway import GatewayProcess
from .gather import Gather
from .inbox import Inbox
from .logs import RateLimited, event
from .media_checks import MediaChecks
from .metrics import Metrics
from .outbox import Outbox
from .peers import Peers, may_control
from .pool import WorkerPool
from .reload import Reloads
from .sdnotify import Notifier
from .settings import ServeSettings
from .signals import SignalFlags
from .sockets import StartupError, bind_router
from .status import Counters, daemon_status, describe_model, prefix_cache, status_line
from .workers import BUSY, IDLE, STOPPING, WorkerHandle

log = logging.getLogger("jevany.supervisor")

RECEIVE_BURST = 1000      # worker messages taken per turn (client messages: a time budget, inbox.py)
IDLE_WAIT_MS = 200        # longest sleep in poll; bounds how late a hang or a report is noticed
REPORT_EVERY_S = 2.0      # how often the systemd STATUS= line is renewed
OVERLOAD_LOG_EVERY_S = 10.0
MAX_FAILED_STARTS = 3     # a slot whose replacements die this often before loading stops the daemon


class Supervisor:
    def __init__(self, settings: ServeSettings, clock=time.monotonic, reload_settings=None, env=os.environ):
        self.settings = settings
        self.clock = clock
        self.queue = RequestQueue(settings.max_queue)
        self.counters = Counters()
        self.metrics = Metrics()
        self.notifier = Notifier(env)
        self.reloads = Reloads(self, reload_settings or (lambda: settings))
        self.overloads = RateLimited(log, "overload", OVERLOAD_LOG_EVERY_S, clock, level=logging.WARNING)
        self.state = "starting"
        self.version = __version__
        self.started = clock()
        self.exit_code = 0
        self.done = False
        self.zap = None
        self.gateway: GatewayProcess | None = None    # the HTTP gateway, with --http
        self.media: MediaChecks | None = None          # the media checker, with --media-root
        self.metrics_url = None
        self._tags = count(1)
        self.signals: SignalFlags | None = None
        self._stop_now = False
        self._exiting = False              # drain ends in exit (signal) rather than idling (drain op)
        self._drain_waiters: list = []     # control clients awaiting "drained"
        self.clears = CacheClears()        # control clients awaiting clear_cache's count
        self.gather = Gather()             # when a free worker waits for answered clients (GPU-aware)
        self._gather_until: float | None = None
        self._answered: list = []          # (entry, ok, result or error) from workers, sent after dispatch
        self._listeners: list = []         # every bound client endpoint (sockets.Listener)
        self._failure: str | None = None
        self._next_report = self._next_watchdog = clock()
        self._decided_at_report = (0, clock())

    # --- lifecycle -------------------------------------------------------

    def run(self) -> int:
        try:
            self.start()
            while not self.done:
                self.tick()
        except StartupError as exc:
            self.exit_code, self._failure = 1, str(exc)     # what the stop event reports, and the exit status
            raise
        finally:
            self.close()
        return self.exit_code

    def start(self) -> None:
        self.fd_limit = fds.raise_limit()     # before any socket: headroom for clients costs nothing unused
        self.ctx = zmq.Context()
        self.poller = zmq.Poller()
        self.peers = Peers(self.poller, self.clock)
        self.outbox = Outbox(self.peers, self.clock)
        self.inbox = Inbox(self.peers, self.clock)
        self._start_curve()
        self.public = [self._bind_client_socket(ep, flag="--bind") for ep in self.settings.endpoints]
        public_listeners = list(self._listeners)
        control = self.settings.control_endpoint
        self.control = self._bind_client_socket(control, mode=0o600, flag="--control") if control else None
        # The control endpoint keeps listening under pressure: only its owner can reach it.
        self.fd_guard = fds.FdGuard(self.peers, public_listeners, self.busy_fds, self.clock, self.fd_limit)
        self._start_backend()
        if self.settings.media_root:
            self.media = MediaChecks(self.ctx, self.poller, self._rundir, self.settings, self.clock)
        self.signals = SignalFlags(self.poller)
        self._start_metrics()
        self._start_gateway()
        self.pool.start_generation(self.settings)
        event(log, "start", version=__version__, endpoints=",".join(self.settings.endpoints),
              control=control or "none", model=self.settings.model or "tiny-demo",
              workers=self.settings.worker_count, devices=",".join(self.settings.worker_devices()),
              max_batch_size=self.settings.engine.max_batch_size, max_queue=self.settings.max_queue,
              curve="on" if self.zap else "off", metrics=self.metrics_url or "off",
              http=f"http://{self.settings.http}" if self.gateway else "off")

    def tick(self) -> None:
        ready = self.wait()
        self.handle_signals()
        self.authenticate(ready)
        self.receive_clients(ready)
        self.receive_media(ready)
        self.receive_workers()
        self.expire_deadlines()
        self.dispatch()
        self.send_answers()
        self.watch_workers()
        self.guard_fds()
        self.reloads.advance()
        self.finish_drain()
        self.report()

    def close(self) -> None:
        # Client sockets first: a client connected to several daemons sees this one go at once
        # and sends elsewhere whatever it still awaits from here (final replies still leave: LINGER).
        if hasattr(self, "peers"):
            self.peers.close_monitors()     # their PAIR sockets would hold ctx.term() for ever
        for sock in getattr(self, "public", []) + [getattr(self, "control", None)]:
            if sock is not None:
                sock.close()
        if self.gateway is not None:
            self.gateway.close()       # after the drain: its callers have had their replies
        if self.media is not None:
            self.media.close()         # empty by now: the drain waited for its checks
        if hasattr(self, "pool"):
            self.pool.stop_all()
        if hasattr(self, "backend"):
            self.backend.close()
        if self.zap is not None:
            self.zap.close()
        if hasattr(self, "ctx"):
            self.ctx.term()
        for listener in self._listeners:
            listener.remove_file()      # only while it is still ours: never another user's socket
        if getattr(self, "_rundir", None):
            shutil.rmtree(self._rundir, ignore_errors=True)
        if self.signals is not None:
            self.signals.close()
        self.metrics.close()
        self.notifier.close()
        event(log, "stop", exit_code=self.exit_code, **({"error": self._failure} if self._failure else {}))

    # --- sockets -----------------------------------------------------------

    def _start_curve(self) -> None:
        if not self.settings.curve:
            return
        try:
            self._curve_keys = curve.load_server_keys(self.settings.curve_secret_key)
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        self.zap = curve.ZapHandler(self.ctx, self.settings.curve_allowed_clients, self.clock)
        self.poller.register(self.zap.sock, zmq.POLLIN)

    def _start_backend(self) -> None:
        self._rundir = tempfile.mkdtemp(prefix="jevany-workers-")   # 0700: only we reach the workers
        endpoint = f"ipc://{self._rundir}/backend.sock"
        self.backend = self.ctx.socket(zmq.ROUTER)
        self.backend.setsockopt(zmq.LINGER, 0)
        self.backend.bind(endpoint)
        self.poller.register(self.backend, zmq.POLLIN)
        self.pool = WorkerPool(self.backend, endpoint, self.poller, self.clock)

    def _start_metrics(self) -> None:
        if self.settings.metrics_port is None:
            return
        host = self.settings.metrics_host
        shown = f"[{host}]" if ":" in host else host
        try:
            port = self.metrics.serve(self.settings.metrics_port, host)
        except OSError as exc:
            raise StartupError(f"cannot serve metrics on {shown}:{self.settings.metrics_port}: {exc}") from None
        self.metrics_url = f"http://{shown}:{port}/metrics"

    def _start_gateway(self) -> None:
        if self.settings.http is None:
            return
        self.gateway = GatewayProcess(self.ctx, self.poller, self._rundir, self.settings, self.clock)
        self.inbox.gateway_sock = self.gateway.sock
        self.gateway.start(self.metrics_url)

    def transport(self, sock) -> str:
        """Where a request came from, for the counts that keep HTTP and ZeroMQ apart."""
        return "http" if self.gateway is not None and sock is self.gateway.sock else "zmq"

    def _bind_client_socket(self, endpoint: str, flag: str, mode: int | None = None):
        keys = self._curve_keys if self.zap is not None else None
        sock, listener = bind_router(self.ctx, endpoint, self.settings.max_message_bytes, keys,
                                     self.settings.socket_mode if mode is None else mode, flag=flag)
        self._listeners.append(listener)
        self.peers.watch(sock)
        self.inbox.watched.add(sock)
        self.poller.register(sock, zmq.POLLIN)
        return sock

    # --- phases ----------------------------------------------------------

    def wait(self) -> dict:
        now = self.clock()
        timeout = IDLE_WAIT_MS
        deadline = self.queue.next_deadline()
        if deadline is not None:
            timeout = min(timeout, int((deadline - now) * 1000) + 1)
        if self.notifier.watchdog_s is not None:
            timeout = min(timeout, int((self._next_watchdog - now) * 1000) + 1)
        if self.gateway is not None and (restart_in := self.gateway.wait_s()) is not None:
            timeout = min(timeout, int(restart_in * 1000) + 1)
        if self.media is not None and (due := self.media.next_deadline()) is not None:
            timeout = min(timeout, int((due - now) * 1000) + 1)
        if self._gather_until is not None:
            timeout = min(timeout, max(0, int((self._gather_until - now) * 1000) + 1))
        return dict(self.poller.poll(max(0, timeout)))

    def handle_signals(self) -> None:
        for signum in self.signals.take():
            if signum == signal.SIGHUP:
                self.reloads.begin(cause="SIGHUP")
                continue
            if self.state == "draining" and self._exiting:
                self._stop_now = True     # a second signal: stop without waiting for the queue
            self.begin_drain(exiting=True, cause=signal.Signals(signum).name)

    def authenticate(self, ready: dict) -> None:
        if self.zap is not None and self.zap.sock in ready:
            self.zap.handle()

    def receive_clients(self, ready: dict) -> None:
        # Every client socket, whatever poll saw: a turn cut short by the budget left some waiting.
        self.peers.read()
        gateway = [self.gateway.sock] if self.gateway is not None else []
        self.inbox.take(self.public + ([self.control] if self.control else []) + gateway, self.handle_message)

    def receive_media(self, ready: dict) -> None:
        if self.media is not None:
            for entry, ok, outcome in self.media.receive(ready):
                self.media_checked(entry, ok, outcome)

    def media_checked(self, entry: Entry, ok: bool, outcome) -> None:
        """A checked media request joins the queue (with its resolved files), or gets the policy's refusal."""
        if not ok:
            self.reply_error(entry, InvalidRequestError(outcome))
        elif self._stop_now:
            self.reply_error(entry, ShuttingDownError("the daemon stopped before scoring this request"))
        elif self.queue.full:
            self.reply_error(entry, OverloadedError(f"queue is full ({self.queue.max_depth} requests waiting); "
                                                    "retry later"))
        else:
            entry.media = outcome
            self.queue.push(entry)

    def receive_workers(self) -> None:
        # Whatever poll saw: after a long turn, heartbeats wait here that poll knew nothing of.
        for _ in range(RECEIVE_BURST):
            try:
                ident, payload = self.backend.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:
                continue   # not a worker's two-frame message; nothing else can reach this ipc path
            worker = self.pool.find(ident)
            if worker is not None:
                worker.last_seen = self.clock()
                self.handle_worker_message(worker, channel.decode(payload))

    def expire_deadlines(self) -> None:
        now = self.clock()
        expired = self.queue.take_expired(now) + (self.media.take_expired(now) if self.media is not None else [])
        for entry in expired:
            self.reply_error(entry, DeadlineExceededError("timeout_ms passed before scoring began"))

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
        for worker in self.pool.serving():
            if not len(self.queue):
                return
            if worker.available:
                until = self.gather.hold_until(len(self.queue), full, now)
                if until is not None:
                    self._gather_until = until if self._gather_until is None else min(self._gather_until, until)
                    continue
            elif not (worker.can_prefetch and len(self.queue) >= full):
                continue
            entries = self.queue.take(full)
            for entry in entries:
                self.metrics.queue_wait.observe(now - entry.received)
            worker.hand_over(self.backend, entries, now)

    def send_answers(self) -> None:
        """Reply to what workers answered this tick. After dispatch, so a worker that just freed
        takes the queue at once instead of idling while dozens of replies are sent."""
        answered, self._answered = self._answered, []
        for entry, ok, outcome in answered:
            if ok:
                self.reply_ok(entry, outcome)
            else:
                self.reply_error(entry, outcome)

    def watch_workers(self) -> None:
        self.receive_workers()     # a worker is judged on everything it has said, not on what poll saw
        for worker, cause in self.pool.hung():
            event(log, "worker_hung", level=logging.WARNING, index=worker.slot, pid=worker.pid, cause=cause)
            worker.kill(cause)
        for worker in self.pool.exited():
            self.on_worker_exit(worker)
        self.pool.retire_idle()
        if self.media is not None:
            self.receive_media(None)      # likewise a check that finished is not judged overdue
            for entry, ok, outcome in self.media.watch():
                self.media_checked(entry, ok, outcome)
        if self.gateway is not None:
            # While stopping, one that exits is reaped but not started again.
            self.gateway.watch(restart=not (self.state == "draining" and self._exiting))

    def guard_fds(self) -> None:
        self.peers.read()
        self.fd_guard.check()

    def busy_fds(self) -> set:
        """Descriptors of peers holding a request: never closed for being idle."""
        entries = list(self.queue) + [e for w in self.pool.workers for e in w.inflight.values()]
        if self.media is not None:
            entries += self.media.entries()
        return {e.envelope.peer.fd for e in entries if getattr(e.envelope, "peer", None) is not None}

    def finish_drain(self) -> None:
        if self.state != "draining":
            return
        if self._stop_now:
            waiting = self.queue.take_all() + (self.media.close_waiting() if self.media is not None else [])
            for entry in waiting:
                self.reply_error(entry, ShuttingDownError("the daemon stopped before scoring this request"))
        if len(self.queue) or self.pool.inflight() or (self.media is not None and self.media.pending()):
            return
        for sock, envelope, rid in self._drain_waiters:
            self.send(sock, envelope, ok_reply(rid, {"state": "drained"}))
        self._drain_waiters.clear()
        if self._exiting:
            self.done = True
        else:
            self.state = "drained"      # what status says from now on: nothing left, nothing taken

    def report(self) -> None:
        now = self.clock()
        if self.metrics_url is not None:     # a few label lookups per tick, on every request's path
            self.metrics.gauges(len(self.queue), self.queue.max_depth, self.pool.inflight(),
                                [w.state for w in self.pool.workers], self.state == "ready")
            self.metrics.prefix_cache_stats(prefix_cache(self))
            self.metrics.descriptors(self.fd_guard.describe())
        self.overloads.flush()
        self.outbox.dropped.flush()
        if self.notifier.watchdog_s is not None and now >= self._next_watchdog:
            self.notifier.watchdog()
            self._next_watchdog = now + self.notifier.watchdog_s
        if now >= self._next_report:
            self._next_report = now + REPORT_EVERY_S
            self.notifier.status(self.status_line())     # while loading too: "starting: 1/2 workers"
            self.outbox.forget_gone()

    def status_line(self) -> str:
        """systemd's STATUS=: workers up, queue depth, decide replies per second since the last line."""
        decided, now = self.counters.by_op["decide"], self.clock()
        before, since = self._decided_at_report
        self._decided_at_report = (decided, now)
        return status_line(self, (decided - before) / max(now - since, 1e-9))

    # --- client messages -------------------------------------------------

    def handle_message(self, sock, envelope: list, payload: bytes) -> None:
        received = self.clock()
        try:
            request = decode_request(payload)
        except JevanyError as exc:
            self.record(None, exc.code, transport=self.transport(sock))
            self.send(sock, envelope, error_reply(exc.request_id, exc))
            return
        try:
            if request.op in CONTROL_OPS and sock is not self.control:
                raise ForbiddenError(f"{request.op} is a control op; send it to the control endpoint")
            if request.op in CONTROL_OPS and not may_control(envelope):
                raise ForbiddenError(f"{request.op} is a control op; only the daemon's own user may send it")
            handler = getattr(self, f"op_{request.op}")
            result = handler(sock, envelope, request, received, payload)
        except JevanyError as exc:
            self.record(request.op, exc.code, transport=self.transport(sock))
            if request.op == "decide" and self.settings.log_requests:
                # Refused before it was queued (overloaded, shutting_down, a bad body): still one line.
                event(log, "request", id=request.id, outcome=exc.code)
            reply = error_reply(request.id, exc)
            self.send(sock, envelope, self.with_load(reply) if request.op == "decide" else reply)
            return
        if result is not None:
            self.record(request.op, None, transport=self.transport(sock))
            self.send(sock, envelope, ok_reply(request.id, result))

    def op_decide(self, sock, envelope, request, received, payload):
        if self.state in ("draining", "drained"):
            raise ShuttingDownError(f"the daemon is {self.state} and takes no new work")
        if self._failure:
            raise ShuttingDownError("the daemon is stopping")
        decision = parse_decision(request.body)    # reject bad bodies here, before they take a queue slot
        if decision.media and self.media is None:
            raise InvalidRequestError("media is disabled; the server operator must set JEVANY_MEDIA_ROOT")
        checking = self.media.pending() if self.media is not None else 0
        if len(self.queue) + checking >= self.queue.max_depth:
            self.overloads.hit(queue=len(self.queue), max_queue=self.queue.max_depth)
            raise OverloadedError(f"queue is full ({self.queue.max_depth} requests waiting); retry later")
        deadline = None if request.timeout_ms is None else received + request.timeout_ms / 1000
        # Queue the bytes, not the decoded body: a decoded msgpack value can be
        # tens of times its wire size, and the worker decodes it anyway.
        entry = Entry(next(self._tags), sock, envelope, request.id, payload, received, deadline,
                      self.transport(sock))
        self.gather.arrived(entry.client, received)
        if decision.media:
            self.media.submit(entry, [[m.type, m.uri] for m in decision.media])   # queued once checked
        else:
            self.queue.push(entry)
        return None    # the reply comes when a worker answers

    def op_ping(self, sock, envelope, request, received, payload):
        return {"pong": True, "version": __version__}

    def op_status(self, sock, envelope, request, received, payload):
        return self.status(private=sock is self.control)

    def op_models(self, sock, envelope, request, received, payload):
        return {"models": [self.model_description(private=sock is self.control)]}

    def op_clear_cache(self, sock, envelope, request, received, payload):
        ready = [w for w in self.pool.workers if w.ready_once and w.state != STOPPING and w.kill_cause is None]
        if not ready:
            return {"cleared": 0}
        for worker in ready:     # a busy worker answers once its batch is done
            self.pool.backend.send_multipart([worker.identity, channel.encode(channel.CLEAR)])
        self.clears.begin((sock, envelope, request.id), {w.identity for w in ready})
        self.record(request.op, None)
        return None    # the reply comes when every worker has cleared

    def finish_clears(self, done: list) -> None:
        for (sock, envelope, rid), cleared in done:
            self.send(sock, envelope, ok_reply(rid, {"cleared": cleared}))

    def op_drain(self, sock, envelope, request, received, payload):
        self.begin_drain(exiting=False, cause="drain op")
        self._drain_waiters.append((sock, envelope, request.id))
        self.record(request.op, None)
        return None

    def op_reload(self, sock, envelope, request, received, payload):
        self.reloads.begin(cause="reload op", waiter=(sock, envelope, request.id))
        return None    # the reply comes when the new workers serve, or the reload fails

    def begin_drain(self, exiting: bool, cause: str) -> None:
        if self.state not in ("draining", "drained"):
            event(log, "drain", cause=cause, queued=len(self.queue), inflight=self.pool.inflight())
            self.notifier.stopping(f"draining: {cause}")
            self.reloads.cancel("the daemon began draining")
        self.state = "draining"
        self._exiting = self._exiting or exiting

    # --- worker messages -------------------------------------------------

    def handle_worker_message(self, worker: WorkerHandle, message: list) -> None:
        kind, *args = message
        if kind == channel.HELLO:
            self.on_worker_ready(worker, args[0])
        elif kind == channel.EARLY:
            self.on_early(worker, *args)
        elif kind == channel.RESULTS:
            self.on_results(worker, *args)
        elif kind == channel.CLEARED:
            worker.stats = {**worker.stats, "prefix_cache": args[1]}
            self.finish_clears(self.clears.answered(worker.identity, args[0]))
        elif kind == channel.FAILED:
            worker.failure = args[0]

    def on_worker_ready(self, worker: WorkerHandle, hello: dict) -> None:
        worker.model, worker.state, worker.ready_once = hello["model"], IDLE, True
        worker.note_device_info(hello.get("device_info"))
        worker.overlaps = bool(hello.get("overlaps"))
        fields = {}
        if worker.replacing_since is not None:
            fields["replaced_in_s"] = round(self.clock() - worker.replacing_since, 3)
        event(log, "worker_ready", index=worker.slot, pid=hello["pid"], generation=worker.generation,
              model=worker.model["id"], readout=worker.model["readout"], layout=worker.model["layout"],
              device=worker.device, load_s=hello.get("load_s"), **fields)
        if self.state == "starting" and all(w.ready_once for w in self.pool.serving()):
            self.state = "ready"
            self.metrics.describe_model(self.model_description())
            event(log, "ready", workers=len(self.pool.serving()), model=worker.model["id"],
                  seconds=round(self.clock() - self.started, 3))
            self.notifier.ready(self.status_line())

    def on_early(self, worker: WorkerHandle, results: list, stats: dict, batches: list, seq=None) -> None:
        """One pass of a longer hand-over: its callers are answered now, not after the last pass."""
        self.take_answers(worker, results, stats, batches)
        if worker.state == BUSY:
            worker.busy_since = self.clock()     # the batch timeout bounds each pass, and this one ended

    def on_results(self, worker: WorkerHandle, results: list, stats: dict, batches: list = (), seq=None) -> None:
        """The last answers of what the worker held when it sent them; idle, unless a later hand-over
        was still on its way to it."""
        self.take_answers(worker, results, stats, batches)
        read = worker.handed if seq is None else seq
        for tag, entry in list(worker.inflight.items()):
            if entry.handover <= read:    # a worker that skipped one broke its promise
                self._answered.append((entry, False, InternalError("the worker returned no answer for this request")))
                del worker.inflight[tag]
        if worker.state == BUSY and read >= worker.handed:
            worker.state, worker.busy_since = IDLE, None

    def take_answers(self, worker: WorkerHandle, results: list, stats: dict, batches: list) -> None:
        worker.take_stats(stats)
        self.metrics.batches(batches)
        self.gather.passes(batches)
        self.counters.mixed_batches += sum(1 for b in batches if len(b) > 5 and len(b[5]) > 1)
        for tag, ok, payload in results:
            entry = worker.inflight.pop(tag, None)
            if entry is None:
                continue
            worker.requests += 1
            self._answered.append((entry, ok, payload if ok else error_from_wire(payload)))

    def on_worker_exit(self, worker: WorkerHandle) -> None:
        self.pool.remove(worker)
        self.finish_clears(self.clears.gone(worker.identity))
        for entry in worker.inflight.values():
            self.reply_error(entry, WorkerLostError("the worker scoring this request died; it is being restarted"))
        worker.inflight.clear()
        cause = worker.exit_cause()
        if worker.state == STOPPING and worker.kill_cause is None:
            event(log, "worker_stopped", index=worker.slot, pid=worker.pid, generation=worker.generation)
            return
        event(log, "worker_exit", level=logging.WARNING, index=worker.slot, pid=worker.pid,
              generation=worker.generation, role=self.pool.role(worker), code=worker.proc.returncode, cause=cause)
        role = self.pool.role(worker)
        if role == "incoming":
            self.reloads.worker_failed(worker, cause)
        elif role == "serving":
            self.replace_or_fail(worker, cause)

    def replace_or_fail(self, worker: WorkerHandle, cause: str) -> None:
        if self.state == "draining" and self._exiting:
            return
        never_served = self.state == "starting" and not worker.ready_once
        if not worker.ready_once and (worker.proc.returncode == channel.EXIT_LOAD_FAILED or never_served
                                      or worker.failed_starts + 1 >= MAX_FAILED_STARTS):
            self.fail(worker.failure or f"worker {worker.slot} exited before loading the model ({cause})")
            return
        replacement = self.pool.replace(worker, self.settings)
        self.metrics.restarts.labels("hung" if worker.kill_cause else "died").inc()
        event(log, "worker_restart", index=worker.slot, restarts=replacement.restarts, pid=replacement.pid)

    def fail(self, message: str) -> None:
        """Stop the daemon: nothing can serve (a model that will not load)."""
        self._failure = self._failure or message
        event(log, "startup_failed" if self.state == "starting" else "failed", level=logging.ERROR,
              error=self._failure)
        self.exit_code = 1
        self.begin_drain(exiting=True, cause="worker failed to start")
        self._stop_now = True

    # --- replies ---------------------------------------------------------

    def record(self, op: str | None, code: str | None, latency_s: float | None = None,
               transport: str = "zmq") -> None:
        self.counters.record(op, code, latency_s, transport)
        self.metrics.reply(op, code, transport)
        if latency_s is not None:
            self.metrics.latency.observe(latency_s)

    def reply_ok(self, entry: Entry, result: dict) -> None:
        latency = self.clock() - entry.received
        self.gather.answered(entry.client, entry.received + latency)
        self.record("decide", None, latency, self.transport(entry.sock))
        if self.settings.log_requests:
            event(log, "request", id=entry.id, outcome="ok", ms=round(latency * 1000, 2))
        self.send(entry.sock, entry.envelope, self.with_load(ok_reply(entry.id, result)))

    def reply_error(self, entry: Entry, err: JevanyError) -> None:
        now = self.clock()
        self.gather.answered(entry.client, now)
        self.record("decide", err.code, now - entry.received, self.transport(entry.sock))
        if self.settings.log_requests:
            event(log, "request", id=entry.id, outcome=err.code)
        self.send(entry.sock, entry.envelope, self.with_load(error_reply(entry.id, err)))

    def with_load(self, reply: dict) -> dict:
        """A decide reply carries this daemon's load (PROTOCOL.md, "load"): what clients routing
        over several daemons weigh, read here rather than asked for by a status call."""
        reply["load"] = {"queue": len(self.queue), "inflight": self.pool.inflight()}
        return reply

    def send(self, sock, envelope: list, reply: dict) -> None:
        self.outbox.send(sock, envelope, pack(reply))     # to the connection that asked, within its bounds

    # --- status ----------------------------------------------------------

    def model_description(self, private: bool = True) -> dict:
        return describe_model(self, private)

    def status(self, private: bool = True) -> dict:
        """private: for the control endpoint, with what one client must not learn of another's requests."""
        return daemon_status(self, private)
