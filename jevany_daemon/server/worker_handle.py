"""Worker processes as the supervisor sees them: spawn, hand over work, notice death or silence."""
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from jevany_daemon import channel
from jevany_daemon.inherited_settings import settings_fd

from .device_names import worker_view
from .pace import Pace
from .request_queue import Entry
from .sdnotify import worker_environment

STARTING, IDLE, BUSY, STOPPING = "starting", "idle", "busy", "stopping"


@dataclass(eq=False)
class WorkerHandle:
    slot: int                  # its place in its generation (0..workers-1)
    serial: int                # unique per process the supervisor starts
    generation: int            # which model load it belongs to; a reload starts the next
    proc: subprocess.Popen
    device: str                # as the operator named it (cuda:1), though the worker calls it cuda:0
    heartbeat_timeout: float
    batch_timeout: float
    spawned_at: float
    state: str = STARTING
    inflight: dict = field(default_factory=dict)    # tag → Entry, everything it was handed
    restarts: int = 0          # predecessors in this slot that died or hung
    failed_starts: int = 0     # predecessors in a row that died before loading
    requests: int = 0
    model: dict | None = None  # describe() from its hello
    stats: dict = field(default_factory=dict)       # its engine's batching statistics
    device_info: dict | None = None   # the worker's own report: device name, memory used and total
    ready_once: bool = False
    last_seen: float = 0.0     # any message, heartbeats included
    busy_since: float | None = None
    stop_sent_at: float | None = None
    kill_cause: str | None = None    # why the supervisor killed it, for the exit line
    failure: str | None = None       # the message it sent when it could not load
    replacing_since: float | None = None   # when its predecessor's death was noticed
    sentinel: int | None = None      # a pidfd: readable the moment the process exits
    handed: int = 0                  # hand-overs sent; the worker's RESULTS say which it had read
    overlaps: bool = False           # its host works while its device runs (from its hello): it may prefetch
    pace: Pace = field(default_factory=Pace)    # how fast it scores against its own best (pace.py)
    collector: dict | None = None    # its Python collector's totals, as it last reported them
    threads: dict | None = None      # its engine's thread policy (engine/thread_policy.py), as last reported

    @property
    def identity(self) -> bytes:
        # A new identity per process: late messages from a dead one can't be mistaken for its successor's.
        return f"w{self.slot}.{self.serial}".encode()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def available(self) -> bool:
        return self.state == IDLE and self.kill_cause is None

    @property
    def can_prefetch(self) -> bool:
        """Busy with one hand-over and nothing more: it may take the next pass's worth now, to admit it
        while the device runs and launch it the moment the device is free. Only a worker whose host
        overlaps its device: on a CPU nothing would run meanwhile, and what it holds would only leave
        the queue, where deadlines and --max-queue are kept to the letter."""
        return (self.overlaps and self.state == BUSY and self.kill_cause is None
                and len({e.handover for e in self.inflight.values()}) <= 1)

    def hand_over(self, backend, entries: list[Entry], now: float) -> None:
        self.handed += 1
        for e in entries:
            e.handover = self.handed
            self.inflight[e.tag] = e
        if self.state != BUSY:
            self.state, self.busy_since = BUSY, now
        # The time each has left, not its deadline (the supervisor's clock may not be the host's, as in
        # tests), and when it was sent by the host's monotonic clock, which the worker shares: the
        # worker drops what expired before its pass began, counting the time a hand-over sat unread.
        sent_at = time.monotonic()
        items = [channel.HandedOver(e.tag, e.payload, e.transport, e.media,
                                    None if e.deadline is None else e.deadline - now, e.tenant, sent_at)
                 for e in entries]
        backend.send_multipart([self.identity, channel.encode(channel.BATCH, items, self.handed)])

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def silent_for(self, now: float) -> float:
        return now - self.last_seen

    def hang_cause(self, now: float, stop_within_s: float) -> str | None:
        """Why this worker counts as hung now, or None."""
        if self.kill_cause is not None:
            return None
        if self.ready_once and self.silent_for(now) > self.heartbeat_timeout:
            return f"hung: no heartbeat for {self.silent_for(now):.1f}s"
        if self.state == BUSY and now - self.busy_since > self.batch_timeout:
            return f"hung: batch unanswered after {now - self.busy_since:.1f}s"
        if self.state == STOPPING and now - self.stop_sent_at > stop_within_s:
            return f"hung: still running {stop_within_s:.0f}s after stop"
        return None

    def kill(self, cause: str) -> None:
        self.kill_cause = cause
        try:
            self.proc.send_signal(signal.SIGKILL)    # works on a stopped (SIGSTOP) process too
        except ProcessLookupError:
            pass

    def exit_cause(self) -> str:
        code = self.proc.returncode
        if self.kill_cause:
            return f"{self.kill_cause}; killed"
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        if code == channel.EXIT_LOAD_FAILED:
            return "could not load the model"
        if code == channel.EXIT_DEVICE_LOST:
            return "device error: its CUDA context cannot be used again"
        if code == channel.EXIT_SETTINGS:
            return "its settings cannot work here (a shape plan past --warmup-limit)"
        return f"exit code {code}"

    def take_stats(self, stats: dict) -> None:
        """An EARLY or RESULTS message's statistics; a device report travels with them when the worker sends one."""
        stats = dict(stats or {})
        self.note_device_info(stats.pop("device_info", None))
        self.collector = stats.pop("collector", self.collector)
        self.threads = stats.pop("threads", self.threads)
        self.stats = stats

    def note_device_info(self, info) -> None:
        if isinstance(info, dict):     # older workers send none: keep what we had
            self.device_info = info

    def describe(self, role: str) -> dict:
        return {"index": self.slot, "pid": self.proc.pid, "device": self.device, "state": self.state,
                "role": role, "generation": self.generation, "restarts": self.restarts,
                "requests": self.requests, "inflight": len(self.inflight), "device_info": self.device_info,
                "pace": self.pace.describe(), "collector": self.collector, "threads": self.threads}


def spawn(slot: int, serial: int, generation: int, backend: str, settings: dict, now: float) -> WorkerHandle:
    worker = WorkerHandle(slot, serial, generation, None, settings["device"], settings["heartbeat_timeout"],
                          settings["batch_timeout"], spawned_at=now, last_seen=now)
    argv, worker_env, handed = worker_launch(worker.identity.decode(), backend, settings)
    fd = settings_fd(handed)      # not on its command line, which every local user can read (inherited_settings.py)
    try:
        worker.proc = subprocess.Popen([*argv, "--settings-fd", str(fd)], stdin=subprocess.DEVNULL, env=worker_env,
                                       pass_fds=(fd,))
    finally:
        os.close(fd)
    worker.sentinel = _pidfd(worker.proc.pid)
    return worker


def worker_launch(identity: str, backend: str, settings: dict, env=os.environ) -> tuple[list[str], dict, dict]:
    """The worker's command line (its settings go through a descriptor: spawn), its environment, and the
    settings it is handed: it is shown only the GPUs it serves, by its own names."""
    view = worker_view(settings["device"], env)
    worker_env = worker_environment(env)
    worker_env.update(thread_settings(worker_env))
    worker_env.update(malloc_settings(worker_env))
    if view.cuda_visible is not None:
        worker_env["CUDA_VISIBLE_DEVICES"] = view.cuda_visible
    argv = [sys.executable, "-m", "jevany_daemon.worker", "--backend", backend, "--identity", identity,
            "--parent", str(os.getpid())]
    return argv, worker_env, {**settings, "device": view.device}


# OpenMP's threads, once a parallel region ends, spin for a while before they sleep (libgomp's
# default: 300,000 turns, milliseconds). With client processes on the same cores, the spinning threads
# take the cores the next region needs: a pass then cost 3x its CPU time and 2-3x its wall time, at
# random (benchmarks/omp_wait.py). Passive waiting is not free: on free cores each region wakes its
# threads, and a lone short request at 2 threads took 23 ms against 14 with a spin of 1,000 turns
# (GOMP_SPINCOUNT=1000), which in turn cost 9-25% beside busy processes. No cliffs wins: an operator
# whose workers have cores to themselves may set GOMP_SPINCOUNT (docs/OPERATING.md).
THREAD_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def thread_settings(env) -> dict:
    """THREAD_DEFAULTS, unless the operator set OpenMP's wait policy already: their setting wins."""
    return {} if "OMP_WAIT_POLICY" in env else dict(THREAD_DEFAULTS)


# glibc hands a freed block over its mmap threshold (128 KiB, raised as such blocks are freed) back to
# the OS at once, and trims the heap's free top past 128 KiB: a pass's masks, inputs and activations
# (MBs each) were mapped and zero-filled again every pass: 18,865 page faults and 44 ms in the kernel
# per hand-over of 32 short requests on the tiny Qwen3 (benchmarks/malloc_tuning.py). With blocks up to
# 32 MiB (glibc's largest threshold) kept in the heap and its top kept up to 1 GiB, a worker reuses
# the memory of its last passes, as torch's caching allocator does on a GPU; it keeps the memory of
# its biggest pass instead of returning it. Both are needed: setting either alone fixes the other's
# default, which made it worse. glibc reads them as it starts; other C libraries ignore them.
MALLOC_DEFAULTS = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def malloc_settings(env) -> dict:
    """MALLOC_DEFAULTS, unless the operator tunes glibc's malloc already: their setting wins."""
    return {} if tunes_malloc(env) else dict(MALLOC_DEFAULTS)


def tunes_malloc(env) -> bool:
    """Whether the operator tunes glibc's malloc in env (then the daemon leaves it alone, here and in
    the supervisor: lifecycle.py)."""
    return any(k.startswith("MALLOC_") for k in env) or "glibc.malloc." in env.get("GLIBC_TUNABLES", "")


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):   # no pidfd here: exits are noticed on the next poll timeout
        return None
