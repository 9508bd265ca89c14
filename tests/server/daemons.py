"""A real `jevany-daemon serve` in a subprocess, for the server tests."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jevany_client import JevClient, JevTimeoutError

READY_WITHIN_S = 90.0
STOP_WITHIN_S = 60.0


def rss_kb(pid: int) -> int:
    """A process's resident memory, in kB (its /proc status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no RSS for {pid}")


def wait_for(condition, within_s: float, what: str, poll_s: float = 0.05):
    """Poll condition() until it returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + within_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within_s}s")
        time.sleep(poll_s)   # polling a condition with a deadline, not standing in for a reply


class Daemon:
    """One `jevany-daemon serve` subprocess with its own ipc endpoints and log.

    model None leaves --model out, so the --config file or the environment names it; preexec runs in the
    daemon's process before it starts (a lowered descriptor limit).
    """

    def __init__(self, directory: Path, model: Path | None, *args: str, env: dict | None = None, preexec=None):
        self.dir = directory
        self.socket = directory / "d.sock"
        self.endpoint = f"ipc://{self.socket}"
        self.control = f"ipc://{directory}/c.sock"
        self.log = directory / "daemon.log"
        env = {**os.environ, "JEVANY_LOG_LEVEL": "INFO", "HF_HUB_OFFLINE": "1", **(env or {})}
        model_args = [] if model is None else ["--model", str(model)]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jevany_daemon", "serve", *model_args,
                 "--bind", self.endpoint, "--control", self.control, *args],
                stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_WITHIN_S
        with JevClient(self.endpoint, timeout=0.5) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{self.log.read_text()}")
                try:
                    if client.status()["state"] == "ready":
                        return
                except JevTimeoutError:
                    pass          # no socket file yet (fails at once), or no reply yet
                time.sleep(0.1)   # polling a loading daemon, not standing in for a reply
        raise RuntimeError(f"daemon not ready within {READY_WITHIN_S}s:\n{self.log.read_text()}")

    def status(self) -> dict:
        with self.client(timeout=30) as client:
            return client.status()

    def workers(self) -> list[dict]:
        return self.status()["workers"]

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise

    def client(self, **kw) -> JevClient:
        return JevClient(self.endpoint, **kw)

    def control_client(self, **kw) -> JevClient:
        return JevClient(self.control, **kw)
