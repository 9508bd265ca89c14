"""The supervisor: one loop that owns the public sockets, the queue and the workers.

Each turn of the loop runs the same phases, in order:

    wait → handle signals → receive from clients → receive from workers
         → expire deadlines → dispatch to idle workers → watch workers → finish a drain

Every message a client sends gets exactly one reply: an answer, or a typed
error (invalid_message, overloaded, deadline_exceeded, shutting_down,
worker_lost, ...). No torch here; only the worker processes hold the model.
"""
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from itertools import count

import zmq

from jevany_client.endpoints import ipc_path
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

from . import channel
from .admission import Entry, RequestQueue
from .logs import event
from .settings import ServeSettings
from .status import Counters, merge_batching
from .workers import BUSY, DEAD, IDLE, STOPPING, WorkerHandle, spawn

log = logging.getLogger("jevany.supervisor")

RECEIVE_BURST = 1000      # messages taken from one socket per turn, so no socket starves the rest
IDLE_WAIT_MS = 200        # longest sleep in poll; bounds how late a dead worker is noticed
REPLY_LINGER_MS = 2000    # on close, how long final replies may take to leave
WORKER_STOP_S = 10.0


class StartupError(RuntimeError):
    """The daemon cannot start (socket in use, model failed to load); the message says why."""


class Supervisor:
    def __init__(self, settings: ServeSettings, clock=time.monotonic):
        self.settings = settings
        self.clock = clock
        self.queue = RequestQueue(settings.max_queue)
        self.counters = Counters()
        self.workers: list[WorkerHandle] = []
        self.state = "starting"
        self.started = clock()
        self.exit_code = 0
        self.done = False
        self._tags = count(1)
        self._signals: list[int] = []
        self._stop_now = False
        self._exiting = False              # drain ends in exit (signal) rather than idling (drain op)
        self._drain_waiters: list = []     # control clients awaiting "drained"
        self._bound_ipc: list = []
        self._failure: str | None = None

    # --- lifecycle -------------------------------------------------------

    def run(self) -> int:
        try:
            self.start()
            while not self.done:
                self.tick()
        finally:
            self.close()
        return self.exit_code

    def start(self) -> None:
        self.ctx = zmq.Context()
        self.poller = zmq.Poller()
        self.public = [self._bind_client_socket(ep) for ep in self.settings.endpoints]
        control = self.settings.control_endpoint
        self.control = self._bind_client_socket(control) if control else None
        self._rundir = tempfile.mkdtemp(prefix="jevany-workers-")   # 0700: only we reach the workers
        self.backend_endpoint = f"ipc://{self._rundir}/backend.sock"
        self.backend = self.ctx.socket(zmq.ROUTER)
        self.backend.setsockopt(zmq.LINGER, 0)
        self.backend.bind(self.backend_endpoint)
        self.poller.register(self.backend, zmq.POLLIN)
        self._install_signals()
        self.workers = [spawn(0, 0, self.backend_endpoint, self.settings.to_dict())]
        event(log, "start", version=__version__, endpoints=",".join(self.settings.endpoints),
              control=control or "none", model=self.settings.model or "tiny-demo",
              max_batch_size=self.settings.engine.max_batch_size, max_queue=self.settings.max_queue)

    def tick(self) -> None:
        ready = self.wait()
        self.handle_signals()
        self.receive_clients(ready)
        self.receive_workers(ready)
        self.expire_deadlines()
        self.dispatch()
        self.watch_workers()
        self.finish_drain()

    def close(self) -> None:
        for w in self.workers:
            self._stop_worker(w)
        for sock in getattr(self, "public", []) + [getattr(self, "control", None), getattr(self, "backend", None)]:
            if sock is not None:
                sock.close()
        if hasattr(self, "ctx"):
            self.ctx.term()
        for path in self._bound_ipc:
            path.unlink(missing_ok=True)
        if getattr(self, "_rundir", None):
            shutil.rmtree(self._rundir, ignore_errors=True)
        if hasattr(self, "_wake_r"):
            signal.set_wakeup_fd(-1)
            self._wake_r.close()
            self._wake_w.close()
        event(log, "stop", exit_code=self.exit_code, **({"error": self._failure} if self._failure else {}))

    # --- sockets and signals ---------------------------------------------

    def _bind_client_socket(self, endpoint: str):
        path = ipc_path(endpoint)
        if path is not None:
            self._prepare_ipc_path(path, endpoint)
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, REPLY_LINGER_MS)
        sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            raise StartupError(f"cannot bind {endpoint}: {exc}") from None
        if path is not None:
            self._bound_ipc.append(path)
        self.poller.register(sock, zmq.POLLIN)
        return sock

    def _prepare_ipc_path(self, path, endpoint: str) -> None:
        # libzmq silently replaces an existing socket file, which would steal a
        # running daemon's clients; refuse when something still answers there.
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.parent.stat().st_uid != os.getuid():
            # /tmp/jevany-UID is a predictable name; someone else may have made it first.
            raise StartupError(f"{path.parent} belongs to another user; refusing to put a socket there")
        if path.exists():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
                raise StartupError(f"another process is serving on {endpoint}; stop it or choose another --bind")
            except (ConnectionRefusedError, FileNotFoundError):
                path.unlink(missing_ok=True)   # stale file from a daemon that died
            finally:
                probe.close()

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno())   # wakes poll() the moment a signal lands
        self.poller.register(self._wake_r.fileno(), zmq.POLLIN)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self._signals.append(signum)     # only a flag; the loop acts on it

    # --- phases ----------------------------------------------------------

    def wait(self) -> dict:
        timeout = IDLE_WAIT_MS
        deadline = self.queue.next_deadline()
        if deadline is not None:
            timeout = max(0, min(timeout, int((deadline - self.clock()) * 1000) + 1))
        return dict(self.poller.poll(timeout))

    def handle_signals(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except BlockingIOError:
            pass
        while self._signals:
            signum = self._signals.pop(0)
            if self.state == "draining" and self._exiting:
                self._stop_now = True     # a second signal: stop without waiting for the queue
            self.begin_drain(exiting=True, cause=signal.Signals(signum).name)

    def receive_clients(self, ready: dict) -> None:
        for sock in self.public + ([self.control] if self.control else []):
            if sock not in ready:
                continue
            for _ in range(RECEIVE_BURST):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handle_message(sock, frames)

    def receive_workers(self, ready: dict) -> None:
        if self.backend not in ready:
            return
        for _ in range(RECEIVE_BURST):
            try:
                ident, payload = self.backend.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:
                continue   # not a worker's two-frame message; nothing else can reach this ipc path
            worker = next((w for w in self.workers if w.identity == ident), None)
            if worker is not None:
                self.handle_worker_message(worker, channel.decode(payload))

    def expire_deadlines(self) -> None:
        for entry in self.queue.take_expired(self.clock()):
            self.reply_error(entry, DeadlineExceededError("timeout_ms passed before scoring began"))

    def dispatch(self) -> None:
        for worker in self.workers:
            if worker.state != IDLE or not len(self.queue):
                continue
            entries = self.queue.take(self.settings.engine.max_batch_size)
            worker.hand_over(self.backend, entries)

    def watch_workers(self) -> None:
        for i, worker in enumerate(self.workers):
            if worker.state != DEAD and worker.exited():
                self.on_worker_exit(i, worker)

    def finish_drain(self) -> None:
        if self.state != "draining":
            return
        if self._stop_now:
            for entry in self.queue.take_all():
                self.reply_error(entry, ShuttingDownError("the daemon stopped before scoring this request"))
        busy = any(w.inflight for w in self.workers)
        if len(self.queue) or busy:
            return
        for sock, envelope, rid in self._drain_waiters:
            self.send(sock, envelope, ok_reply(rid, {"state": "drained"}))
        self._drain_waiters.clear()
        if self._exiting:
            self.done = True

    # --- client messages -------------------------------------------------

    def handle_message(self, sock, frames: list) -> None:
        envelope, payload = frames[:-1], frames[-1]
        received = self.clock()
        try:
            request = decode_request(payload)
        except JevanyError as exc:
            self.counters.record(None, exc.code)
            self.send(sock, envelope, error_reply(exc.request_id, exc))
            return
        try:
            if request.op in CONTROL_OPS and sock is not self.control:
                raise ForbiddenError(f"{request.op} is a control op; send it to the control endpoint")
            handler = getattr(self, f"op_{request.op}")
            result = handler(sock, envelope, request, received)
        except JevanyError as exc:
            self.counters.record(request.op, exc.code)
            self.send(sock, envelope, error_reply(request.id, exc))
            return
        if result is not None:
            self.counters.record(request.op, None)
            self.send(sock, envelope, ok_reply(request.id, result))

    def op_decide(self, sock, envelope, request, received):
        if self.state == "draining":
            raise ShuttingDownError("the daemon is draining and takes no new work")
        if self._failure:
            raise ShuttingDownError("the daemon is stopping")
        parse_decision(request.body)      # reject bad bodies here, before they take a queue slot
        if self.queue.full:
            raise OverloadedError(f"queue is full ({self.queue.max_depth} requests waiting); retry later")
        deadline = None if request.timeout_ms is None else received + request.timeout_ms / 1000
        self.queue.push(Entry(next(self._tags), sock, envelope, request.id, request.body, received, deadline))
        return None    # the reply comes when a worker answers

    def op_ping(self, sock, envelope, request, received):
        return {"pong": True, "version": __version__}

    def op_status(self, sock, envelope, request, received):
        return self.status()

    def op_models(self, sock, envelope, request, received):
        return {"models": [self.model_description()]}

    def op_clear_cache(self, sock, envelope, request, received):
        # No prefix cache is kept yet (DESIGN: cache only where eligible); nothing to clear.
        return {"cleared": 0}

    def op_drain(self, sock, envelope, request, received):
        self.begin_drain(exiting=False, cause="drain op")
        self._drain_waiters.append((sock, envelope, request.id))
        self.counters.record(request.op, None)
        return None

    def op_reload(self, sock, envelope, request, received):
        raise InternalError("reload is not supported by this version; restart the daemon instead")

    def begin_drain(self, exiting: bool, cause: str) -> None:
        if self.state != "draining":
            event(log, "drain", cause=cause, queued=len(self.queue),
                  inflight=sum(len(w.inflight) for w in self.workers))
        self.state = "draining"
        self._exiting = self._exiting or exiting

    # --- worker messages -------------------------------------------------

    def handle_worker_message(self, worker: WorkerHandle, message: list) -> None:
        kind, *args = message
        if kind == channel.HELLO:
            worker.model, worker.state, worker.ready_once = args[0]["model"], IDLE, True
            if self.state == "starting":
                self.state = "ready"
            event(log, "worker_ready", index=worker.index, pid=args[0]["pid"], model=worker.model["id"],
                  readout=worker.model["readout"], layout=worker.model["layout"], device=worker.model["device"])
        elif kind == channel.RESULTS:
            results, worker.stats = args
            for tag, ok, payload in results:
                entry = worker.inflight.pop(tag, None)
                if entry is None:
                    continue
                worker.requests += 1
                if ok:
                    self.reply_ok(entry, payload)
                else:
                    self.reply_error(entry, error_from_wire(payload))
            for entry in worker.inflight.values():   # a worker that skipped one broke its promise
                self.reply_error(entry, InternalError("the worker returned no answer for this request"))
            worker.inflight.clear()
            worker.state = IDLE if worker.state == BUSY else worker.state
        elif kind == channel.FAILED:
            self._failure = args[0]

    def on_worker_exit(self, index: int, worker: WorkerHandle) -> None:
        code = worker.proc.returncode
        worker.state = DEAD
        for entry in worker.inflight.values():
            self.reply_error(entry, WorkerLostError("the worker scoring this request died; it is being restarted"))
        worker.inflight.clear()
        event(log, "worker_exit", level=logging.WARNING, index=index, pid=worker.proc.pid, code=code)
        if not worker.ready_once or code == channel.EXIT_LOAD_FAILED:
            self._failure = self._failure or f"worker exited with code {code} before loading the model"
            event(log, "startup_failed", level=logging.ERROR, error=self._failure)
            self.exit_code = 1
            self.begin_drain(exiting=True, cause="worker failed to start")
            self._stop_now = True
            return
        if self.state == "draining" and self._exiting:
            return
        replacement = spawn(index, worker.generation + 1, self.backend_endpoint, self.settings.to_dict())
        replacement.restarts = worker.restarts + 1
        self.workers[index] = replacement
        event(log, "worker_restart", index=index, restarts=replacement.restarts)

    def _stop_worker(self, worker: WorkerHandle) -> None:
        if worker.exited():
            return
        worker.state = STOPPING
        try:
            self.backend.send_multipart([worker.identity, channel.encode(channel.STOP)], zmq.NOBLOCK)
            worker.proc.wait(WORKER_STOP_S)
        except (zmq.ZMQError, subprocess.TimeoutExpired):   # a stuck worker is killed
            worker.proc.kill()
            worker.proc.wait()

    # --- replies ---------------------------------------------------------

    def reply_ok(self, entry: Entry, result: dict) -> None:
        latency = self.clock() - entry.received
        self.counters.record("decide", None, latency)
        if self.settings.log_requests:
            event(log, "request", id=entry.id, outcome="ok", ms=round(latency * 1000, 2))
        self.send(entry.sock, entry.envelope, ok_reply(entry.id, result))

    def reply_error(self, entry: Entry, err: JevanyError) -> None:
        self.counters.record("decide", err.code, self.clock() - entry.received)
        if self.settings.log_requests:
            event(log, "request", id=entry.id, outcome=err.code)
        self.send(entry.sock, entry.envelope, error_reply(entry.id, err))

    def send(self, sock, envelope: list, reply: dict) -> None:
        try:
            sock.send_multipart([*envelope, pack(reply)], zmq.NOBLOCK)
        except zmq.Again:
            # The client's pipe is full (it stopped reading); ROUTER drops
            # rather than block every other client behind it.
            event(log, "reply_dropped", level=logging.WARNING, id=reply.get("id"))

    # --- status ----------------------------------------------------------

    def model_description(self) -> dict:
        model = next((w.model for w in self.workers if w.model), None)
        if model is None:
            s = self.settings
            return {"id": s.model_id or s.model or "tiny-demo", "source": s.model or "tiny-demo",
                    "readout": s.readout or "", "layout": s.engine.layout, "device": s.device, "dtype": s.dtype}
        stats = [w.stats or {} for w in self.workers]
        return {**model, "batching": merge_batching(stats, self.settings.engine.max_batch_size,
                                                     self.settings.engine.max_packed_tokens)}

    def status(self) -> dict:
        model = self.model_description()
        return {
            "version": __version__,
            "pid": os.getpid(),
            "uptime_s": round(self.clock() - self.started, 3),
            "state": self.state,
            "endpoints": list(self.settings.endpoints),
            "control_endpoint": self.settings.control_endpoint,
            "max_message_bytes": self.settings.max_message_bytes,
            "model": {k: model.get(k) for k in ("id", "source", "readout", "layout", "device", "dtype")},
            "batching": merge_batching([w.stats or {} for w in self.workers],
                                       self.settings.engine.max_batch_size, self.settings.engine.max_packed_tokens),
            "queue": {"depth": len(self.queue), "max_depth": self.queue.max_depth},
            "workers": [w.describe() for w in self.workers],
            "requests": self.counters.requests(),
            "latency_ms": self.counters.latency_ms(),
        }
