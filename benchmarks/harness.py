"""What the benchmarks share: timing, daemons started for a run, a pool of client processes, and the
result's tail: the machine it was measured on, and its JSON written.

A Daemon is a real `jevany_daemon serve` on an ipc socket in a temporary
directory; a ClientPool is real processes (loadgen.py) that import
jevany-client and never torch, started once and reused by every measurement.
"""
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from jevany_client import JevClient, JevTimeoutError

HERE = Path(__file__).resolve().parent


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def median(values: list) -> float:
    return statistics.median(values) if values else 0.0


# --- the result -------------------------------------------------------------

def free_port() -> int:
    """A loopback TCP port free now (for a daemon's HTTP gateway)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> int:
    """A process's resident memory, in kB (its /proc status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no RSS for {pid}")


def machine(**extra) -> dict:
    """The machine a result was measured on: its cores, platform, Python and load average (timings need a
    quiet machine; this says how quiet it was), then what a benchmark adds."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()], **extra}


def project_env(env: dict) -> dict:
    """env for a child process that imports this checkout (and its client) before anything installed."""
    # empty parts left out: an empty entry would put the working directory on the path
    parts = [str(HERE.parent), str(HERE.parent / "client"), env.get("PYTHONPATH", "")]
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in parts if p)}


def alternating(settings: list[str], rounds: int, measure) -> dict[str, list]:
    """measure(setting) for each setting in turn, rounds times: the machine's drift falls on all alike."""
    out: dict[str, list] = {setting: [] for setting in settings}
    for _ in range(rounds):
        for setting in settings:
            out[setting].append(measure(setting))
    return out


def like_a_worker() -> None:
    """Run this script again under the settings a worker gets (server/worker_handle.py): OpenMP's wait policy,
    and glibc's malloc thresholds unless --glibc-malloc is on its command line; an operator's own
    settings win. Both are read as a process starts, and what a script measures in its own process
    stands for a worker (and must not disturb one: threads left spinning take the daemon's cores)."""
    from jevany_daemon.server.worker_handle import malloc_settings, thread_settings

    extra = thread_settings(os.environ)
    if "--glibc-malloc" not in sys.argv:
        extra.update(malloc_settings(os.environ))
    if extra:
        os.execve(sys.executable, sys.orig_argv, {**os.environ, **extra})    # the interpreter's flags kept


def worker_env_in_effect() -> dict:
    """The worker's malloc and thread variables as this process has them (None: the default), for a result."""
    from jevany_daemon.server.worker_handle import MALLOC_DEFAULTS, THREAD_DEFAULTS

    return {k: os.environ.get(k) for k in (*MALLOC_DEFAULTS, *THREAD_DEFAULTS, "GOMP_SPINCOUNT")}


# A hypervisor that leaves one vCPU unrun for a share of the time, as a noisy host does (steal).
STALL_PERIOD_S = 0.004
_STALLER = r"""
import os, sys, time
cpu, share, period = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
os.sched_setaffinity(0, {cpu})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
parent, due = os.getppid(), time.monotonic()
while os.getppid() == parent:
    began = time.monotonic()
    while time.monotonic() - began < share * period:
        pass
    due += period
    time.sleep(max(0.0, due - time.monotonic()))
"""


def stall_cpu(share: float) -> subprocess.Popen:
    """A process that holds this machine's last CPU `share` of every STALL_PERIOD_S, above every ordinary
    thread (SCHED_FIFO: root only), until it is killed or its parent goes. The guest still sees that CPU's
    threads and moves them when another CPU idles: a milder stall than a hypervisor's."""
    if os.geteuid() != 0:
        raise SystemExit("stalling a CPU needs root (a SCHED_FIFO process)")
    cpu = max(os.sched_getaffinity(0))
    return subprocess.Popen([sys.executable, "-c", _STALLER, str(cpu), str(share), str(STALL_PERIOD_S)])


def write_result(result: dict, path: Path) -> None:
    """The result as JSON at path (its directory made if missing), and a line saying where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


# --- the daemon -----------------------------------------------------------

def cpu_seconds(pids) -> float | None:
    """CPU time (user + system, all threads) the processes have used so far; None off Linux."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (the supervisor and its workers), from /proc; [pid] off Linux."""
    pids, children = [pid], {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    for p in pids:
        pids.extend(children.get(p, []))
    return pids


class Daemon:
    def __init__(self, model_dir: Path, args, batch: int, policy: str, extra: tuple[str, ...] = ()):
        self.batch = batch
        self.dir = Path(tempfile.mkdtemp(prefix="jv-bd-"))
        self.endpoint = f"ipc://{self.dir}/d.sock"
        self.control = f"ipc://{self.dir}/c.sock"     # the prefix cache's counters are shown only there
        env = {**os.environ, "JEVANY_BATCH_POLICY": policy, "JEVANY_LOG_LEVEL": "WARNING"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jevany_daemon", "serve", "--model", str(model_dir), "--bind", self.endpoint,
             "--control", self.control, "--max-batch-size", str(batch), "--device", args.device, "--dtype", args.dtype,
             "--max-queue", "4096", *args.serve_args, *extra], env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.proc.kill()     # a daemon that never came up must not outlive the run
            self.proc.wait()
            raise
        self.client = JevClient(self.endpoint, timeout=600, retries=0)
        self.control_client = JevClient(self.control, timeout=600, retries=0)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 600
        with JevClient(self.endpoint, timeout=1) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError("daemon exited during start-up")
                try:
                    if c.status()["state"] == "ready":
                        break
                except JevTimeoutError:
                    pass           # no socket file yet (fails at once), or no reply yet
                time.sleep(0.2)    # loading; poll again
            else:
                raise RuntimeError("daemon not ready")

    def batching(self) -> dict:
        return self.client.status()["batching"]

    def prefix_cache(self) -> dict:
        return self.control_client.status()["prefix_cache"]

    def stop(self) -> None:
        self.client.close()
        self.control_client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


class LoadWindow:
    """What a daemon did over one load, opened just before it starts: throughput, requests a pass, how busy
    its workers were, and the cores' worth of CPU the supervisor, the workers and the clients used."""

    def __init__(self, daemon: Daemon, client_pids: list[int]):
        self.daemon = daemon
        self.groups = [[daemon.proc.pid], process_tree(daemon.proc.pid)[1:], client_pids]
        self.before = daemon.batching()
        self.cpu_before = [cpu_seconds(g) for g in self.groups]
        self.started = time.perf_counter()

    def close(self, requests: int) -> dict:
        elapsed = time.perf_counter() - self.started
        cpu_after = [cpu_seconds(g) for g in self.groups]
        before, after = self.before, self.daemon.batching()
        passes = after["batches"] - before["batches"]
        cores = [None if a is None or b is None else (b - a) / elapsed for a, b in zip(self.cpu_before, cpu_after)]
        return {"rps": requests / elapsed,
                "mean_batch_size": (after["requests"] - before["requests"]) / max(1, passes),
                "busy": (after["busy_s"] - before["busy_s"]) / elapsed,
                "supervisor_cores": cores[0], "worker_cores": cores[1], "client_cores": cores[2]}


class ClientPool:
    """Client processes (benchmarks/loadgen.py), started once and reused by every measurement."""

    def __init__(self, n: int):
        self.conns, self.procs = [], []
        for _ in range(n):
            ours, theirs = socket.socketpair()
            self.procs.append(subprocess.Popen([sys.executable, str(HERE / "loadgen.py"), str(theirs.fileno())],
                                               pass_fds=[theirs.fileno()]))
            theirs.close()
            self.conns.append(Connection(ours.detach()))
        for c in self.conns:     # all interpreters up before anything is timed
            assert c.recv() == "started"

    def run(self, daemon: Daemon, bodies: list, concurrency: int, endpoint: str | None = None) -> dict:
        """Every body once, from `concurrency` closed-loop clients; throughput, latency, and what the daemon did.

        endpoint: where the clients send (default the daemon's ZeroMQ endpoint; http://... its gateway).
        """
        conns = self.conns[:concurrency]
        for k, c in enumerate(conns):
            c.send((endpoint or daemon.endpoint, bodies[k::concurrency]))
        for c in conns:
            assert c.recv() == "ready"
        window = LoadWindow(daemon, [p.pid for p in self.procs[:concurrency]])
        for c in conns:
            c.send("go")
        latencies = [t for c in conns for t in c.recv()]
        return {**window.close(len(bodies)), "latencies": latencies}

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.wait(10)


def inflight_processes(daemon: Daemon, bodies: list, processes: int, inflight: int, kind: str) -> dict:
    """Every body once from `processes` client processes (inflight_load.py), each holding `inflight` requests
    in flight: kind runner, an AsyncJevClient as the eval runner sends; bare, a bare DEALER socket.
    Measured as ClientPool.run measures, over the load alone (each process connects, then waits for go)."""
    procs = []
    try:
        for k in range(processes):
            path = daemon.dir / f"bodies-{kind}-{k}.json"
            path.write_text(json.dumps(bodies[k::processes]))
            procs.append(subprocess.Popen([sys.executable, str(HERE / "inflight_load.py"), daemon.endpoint,
                                           str(path), str(inflight), kind],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"inflight_load.py ({kind}) did not connect")
        window = LoadWindow(daemon, [p.pid for p in procs])
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        lines = [p.stdout.readline() for p in procs]
        figures = window.close(len(bodies))
        for p in procs:
            p.stdin.write("exit\n")      # only now: an exit's CPU must not fall in the window
            p.stdin.flush()
        for p, line in zip(procs, lines):
            if p.wait(60) != 0 or not line:
                raise RuntimeError(f"inflight_load.py ({kind}) failed with exit code {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return figures
