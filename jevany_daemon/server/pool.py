"""Every worker process the supervisor runs, grouped by generation.

The serving generation takes work. During a reload the next generation loads
beside it (incoming); once all of it is ready it becomes the serving one and
the old workers retire: they finish what they hold, get STOP and exit.
"""
import os
import subprocess
from itertools import count

import zmq

from jevany_daemon import channel

from .settings import ServeSettings
from .status import add_stats
from .worker_handle import IDLE, STARTING, STOPPING, WorkerHandle, spawn

STOP_WITHIN_S = 10.0     # a stopped worker that is still running after this is killed


class WorkerPool:
    def __init__(self, backend, backend_endpoint: str, poller, clock):
        self.backend, self.backend_endpoint = backend, backend_endpoint
        self.poller, self.clock = poller, clock
        self.workers: list[WorkerHandle] = []
        self.serving_generation = 0
        self._serials = count(1)
        self._generations = count(0)
        self._by_identity: dict[bytes, WorkerHandle] = {}
        self.gone_stats: dict = {}    # batching statistics of workers that exited, so totals never shrink

    # --- who is who --------------------------------------------------------

    def serving(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w.generation == self.serving_generation]

    def incoming(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w.generation > self.serving_generation]

    def retiring(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w.generation < self.serving_generation]

    def role(self, worker: WorkerHandle) -> str:
        if worker.generation == self.serving_generation:
            return "serving"
        return "incoming" if worker.generation > self.serving_generation else "retiring"

    def find(self, identity: bytes) -> WorkerHandle | None:
        return self._by_identity.get(identity)

    def inflight(self) -> int:
        return sum(len(w.inflight) for w in self.workers)

    def describe(self) -> list[dict]:
        return [w.describe(self.role(w)) for w in sorted(self.workers, key=lambda w: (w.generation, w.slot))]

    # --- starting and stopping -------------------------------------------

    def start_generation(self, settings: ServeSettings) -> int:
        generation = next(self._generations)
        for slot, device in enumerate(settings.worker_devices()):
            self._add(self._spawn(slot, generation, settings.worker_settings(device)))
        return generation

    def replace(self, dead: WorkerHandle, settings: ServeSettings) -> WorkerHandle:
        worker = self._spawn(dead.slot, dead.generation, settings.worker_settings(dead.device))
        worker.restarts = dead.restarts + 1
        worker.failed_starts = 0 if dead.ready_once else dead.failed_starts + 1
        worker.replacing_since = self.clock()
        self._add(worker)
        return worker

    def switch_to(self, generation: int) -> None:
        self.serving_generation = generation

    def retire_idle(self) -> None:
        """Old workers: stop those with nothing in hand; one still loading holds nothing, so kill it."""
        for worker in self.retiring():
            if worker.state == IDLE and worker.kill_cause is None:
                self.stop(worker)
            elif worker.state == STARTING and worker.kill_cause is None:
                worker.kill("retired before it finished loading")

    def discard(self, workers: list[WorkerHandle], cause: str) -> None:
        """Kill workers that hold no work and will not serve (a failed or cancelled reload)."""
        for worker in workers:
            if worker.kill_cause is None and not worker.exited():
                worker.kill(cause)

    def stop(self, worker: WorkerHandle) -> None:
        worker.state, worker.stop_sent_at = STOPPING, self.clock()
        try:
            self.backend.send_multipart([worker.identity, channel.encode(channel.STOP)], zmq.NOBLOCK)
        except zmq.ZMQError:
            worker.kill("the stop message could not be sent")

    def hung(self) -> list[tuple[WorkerHandle, str]]:
        now = self.clock()
        found = [(w, w.hang_cause(now, STOP_WITHIN_S)) for w in self.workers]
        return [(w, cause) for w, cause in found if cause is not None]

    def exited(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w.exited()]

    def remove(self, worker: WorkerHandle) -> None:
        self.workers.remove(worker)
        add_stats(self.gone_stats, worker.stats or {})
        self._by_identity.pop(worker.identity, None)
        self._by_identity.pop(worker.identity + channel.HEARTBEAT_SUFFIX, None)
        if worker.sentinel is not None:
            self.poller.unregister(worker.sentinel)
            os.close(worker.sentinel)
            worker.sentinel = None

    def stop_all(self) -> None:
        """At exit: ask every worker to stop, wait for them together, kill the stubborn."""
        for worker in list(self.workers):
            if worker.exited() or worker.kill_cause is not None or worker.state == STOPPING:
                continue
            if worker.state == STARTING:
                worker.kill("stopped before it finished loading")   # not connected yet: STOP would be lost
            else:
                self.stop(worker)
        for worker in list(self.workers):
            try:
                worker.proc.wait(max(0.0, worker.stop_sent_at + STOP_WITHIN_S - self.clock())
                                 if worker.stop_sent_at else 0)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
            self.remove(worker)

    # --- internals ---------------------------------------------------------

    def _spawn(self, slot: int, generation: int, settings: dict) -> WorkerHandle:
        return spawn(slot, next(self._serials), generation, self.backend_endpoint, settings, self.clock())

    def _add(self, worker: WorkerHandle) -> None:
        self.workers.append(worker)
        self._by_identity[worker.identity] = worker
        self._by_identity[worker.identity + channel.HEARTBEAT_SUFFIX] = worker
        if worker.sentinel is not None:
            self.poller.register(worker.sentinel, zmq.POLLIN)
