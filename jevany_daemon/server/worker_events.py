"""Worker events: what a worker says (hello, early answers, results, cleared, failed) and its exit.

Answers are collected here and sent by the supervisor's send-answers phase,
after dispatch, so a worker that just freed takes the queue first. A worker
that exits loses its requests (worker_lost) and is replaced, unless it never
loaded the model: then nothing can serve, and the daemon stops.
The supervisor's receive-from-workers and watch-workers phases hand their
messages and exits here.
"""
import logging

from jevany_client.errors import InternalError, WorkerLostError, error_from_wire

from jevany_daemon import channel
from jevany_daemon.logs import event

from .run_state import STARTING
from .status import describe_model
from .worker_handle import BUSY, IDLE, STOPPING, WorkerHandle

log = logging.getLogger("jevany.supervisor")

MAX_FAILED_STARTS = 3     # a slot whose replacements die this often before loading stops the daemon


class WorkerEvents:
    def __init__(self, *, pool, run_state, settings, clock, gather, counters, metrics, notifier, status_line,
                 replies, clears, reloads, fail):
        self.pool, self.run_state, self.clock = pool, run_state, clock
        self.settings = settings              # () -> ServeSettings: a reload replaces them
        self.gather, self.counters, self.metrics = gather, counters, metrics
        self.notifier, self.status_line = notifier, status_line
        self.replies, self.clears, self.reloads = replies, clears, reloads
        self.fail = fail                      # (message, exit_code) -> None: the daemon stops
        self.answered: list = []          # (entry, ok, result or error) from workers, sent after dispatch

    def note(self, entry) -> None:
        """An answer to send this tick. The gather hears of it now: dispatch runs before the replies go
        out, and a free worker must know these clients are about to come back (gather.py)."""
        self.answered.append(entry)
        self.gather.answered(entry[0].client, self.clock())

    def take_answered(self) -> list:
        answered, self.answered = self.answered, []
        return answered

    def handle(self, worker: WorkerHandle, message: list) -> None:
        kind, *args = message
        if kind == channel.HELLO:
            self.on_ready(worker, args[0])
        elif kind == channel.EARLY:
            self.on_early(worker, *args)
        elif kind == channel.RESULTS:
            self.on_results(worker, *args)
        elif kind == channel.CLEARED:
            worker.stats = {**worker.stats, "prefix_cache": args[1]}
            self.replies.cleared(self.clears.answered(worker.identity, args[0]))
        elif kind == channel.FAILED:
            worker.failure = args[0]

    def on_ready(self, worker: WorkerHandle, hello: dict) -> None:
        worker.model, worker.state, worker.ready_once = hello["model"], IDLE, True
        worker.note_device_info(hello.get("device_info"))
        worker.overlaps = bool(hello.get("overlaps"))
        fields = {}
        if worker.replacing_since is not None:
            fields["replaced_in_s"] = round(self.clock() - worker.replacing_since, 3)
        event(log, "worker_ready", index=worker.slot, pid=hello["pid"], generation=worker.generation,
              model=worker.model["id"], readout=worker.model["readout"], layout=worker.model["layout"],
              device=worker.device, load_s=hello.get("load_s"), **fields)
        if self.run_state.state == STARTING and all(w.ready_once for w in self.pool.serving()):
            self._all_ready(worker)

    def _all_ready(self, worker: WorkerHandle) -> None:
        """The first generation has loaded: the daemon is ready, and says so (log, metrics, systemd)."""
        self.run_state.ready()
        self.metrics.describe_model(describe_model(self.pool, self.settings()))
        event(log, "ready", workers=len(self.pool.serving()), model=worker.model["id"],
              seconds=round(self.clock() - self.run_state.started, 3))
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
                self.note((entry, False, InternalError("the worker returned no answer for this request")))
                del worker.inflight[tag]
        if worker.state == BUSY and read >= worker.handed:
            worker.state, worker.busy_since = IDLE, None

    def take_answers(self, worker: WorkerHandle, results: list, stats: dict, batches: list) -> None:
        worker.take_stats(stats)
        self.metrics.batches(batches)
        self.gather.passes(batches)
        worker.pace.passes(batches, self.clock())
        self.counters.mixed_batches += sum(1 for b in map(channel.PassRecord.read, batches) if len(b.origins) > 1)
        for answer in map(channel.Answer._make, results):
            entry = worker.inflight.pop(answer.tag, None)
            if entry is None:
                continue
            worker.requests += 1
            self.note((entry, answer.ok, answer.payload if answer.ok else error_from_wire(answer.payload)))

    def on_exit(self, worker: WorkerHandle) -> None:
        self.pool.remove(worker)
        self.replies.cleared(self.clears.gone(worker.identity))
        for entry in worker.inflight.values():
            self.replies.reply_error(entry,
                                     WorkerLostError("the worker scoring this request died; it is being restarted"))
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
        if self.run_state.stopping:
            return
        never_served = self.run_state.state == STARTING and not worker.ready_once
        code = worker.proc.returncode
        # A model that will not load will not load again. A plan that would warm past its limit is a settings
        # error at start; for a replacement while others serve, the estimate may have met a busy machine, so
        # it is tried again, as a crash is, up to MAX_FAILED_STARTS.
        if not worker.ready_once and (code == channel.EXIT_LOAD_FAILED or never_served
                                      or worker.failed_starts + 1 >= MAX_FAILED_STARTS):
            self.fail(worker.failure or f"worker {worker.slot} exited before loading the model ({cause})",
                      exit_code=2 if code == channel.EXIT_SETTINGS else 1)
            return
        replacement = self.pool.replace(worker, self.settings())
        self.metrics.restarts.labels("hung" if worker.kill_cause else "died").inc()
        event(log, "worker_restart", index=worker.slot, restarts=replacement.restarts, pid=replacement.pid)
