"""gpu-check's daemons: real daemons and client processes, made safe to give up on.

A check that fails part-way, passes its time limit or is stopped by a signal
still stops every daemon it started (those still loading too) and every
client process, so a GPU host is left as it was found.
"""
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from harness import ClientPool, Daemon, process_tree

# On --cpu, torch runs one thread in-process and in each daemon worker: the run shares its cores
# with client processes and other daemons, and OpenMP threads that wait on each other made
# it many times slower (parity alone: 28 s on one thread, 350 s on two, on a busy 2-core host).
CPU_THREADS = 1


class CheckError(Exception):
    """The check could not finish; the message says why (exit 3)."""


class CheckDaemon(Daemon):
    """bench's Daemon, made safe to give up on: a failed start or stop never leaves it running."""

    def __init__(self, name: str, model_dir: Path, device: str, dtype: str, batch: int, starting: list,
                 extra: tuple[str, ...] = ()):
        self.name = name
        starting.append(self)      # visible before it is ready, so an abort can kill it mid-start
        serve_args = ["--cpu-threads", str(CPU_THREADS)] if device == "cpu" else []
        try:
            super().__init__(model_dir, SimpleNamespace(device=device, dtype=dtype, serve_args=serve_args), batch,
                             "adaptive", tuple(extra))
        except Exception as exc:
            self.kill()
            raise CheckError(f"daemon {name} did not start: {exc} (its log, if any, is above)") from exc

    def kill(self) -> None:
        """SIGTERM (the daemon drains and stops its workers), then SIGKILL the whole tree."""
        proc = getattr(self, "proc", None)
        if proc is None or proc.poll() is not None:
            return
        tree = process_tree(proc.pid)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            for pid in reversed(tree):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()

    def stop(self) -> None:
        try:
            super().stop()
        except Exception as exc:
            print(f"gpu-check: daemon {self.name} did not stop cleanly ({exc!r}); killing it", file=sys.stderr)
        self.kill()


class Fleet:
    """Every daemon of the run. They start in threads while parity runs in-process (parity is not
    timed, and a 0.8B daemon takes many seconds to load); stop() always leaves none running."""

    def __init__(self):
        self.starting: list[CheckDaemon] = []
        self.ready: dict[str, CheckDaemon] = {}
        self._threads = ThreadPoolExecutor(max_workers=8, thread_name_prefix="daemon-start")
        self._futures = {}

    def launch(self, name: str, model_dir: Path, device: str, dtype: str, batch: int,
               extra: tuple[str, ...] = ()) -> None:
        self._futures[name] = self._threads.submit(CheckDaemon, name, model_dir, device, dtype, batch, self.starting,
                                                   extra)

    def wait(self) -> dict[str, CheckDaemon]:
        errors = []
        for name, future in self._futures.items():
            try:
                self.ready[name] = future.result()
            except CheckError as exc:
                errors.append(str(exc))
        if errors:
            raise CheckError("; ".join(errors))
        return self.ready

    def stop(self) -> None:
        # kill those still starting until every start has returned: a start may not have its process yet
        deadline = time.monotonic() + 60
        while not all(f.done() for f in self._futures.values()) and time.monotonic() < deadline:
            for d in list(self.starting):
                d.kill()
            time.sleep(0.2)
        self._threads.shutdown(wait=False)
        for f in self._futures.values():
            if f.done() and f.exception() is None:
                self.ready[f.result().name] = f.result()
        for d in self.ready.values():
            d.stop()
        for d in self.starting:
            d.kill()


def close_pool(pool: ClientPool) -> None:
    """bench's ClientPool.close, but a client that is stuck or gone is killed rather than waited on."""
    for conn in pool.conns:
        try:
            conn.send(None)
        except OSError:
            pass
    deadline = time.monotonic() + 10      # for them all: a client mid-run waits on a daemon that is gone
    for proc in pool.procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def daemon_name(dtype: str, batch: int, kind: str = "") -> str:
    return f"{kind}{'-' if kind else ''}{dtype}-batch{batch}"

