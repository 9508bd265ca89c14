"""`jevany-eval --serve "ARGS"`: a daemon of the job's own, on a private ipc socket, drained at exit.

An array task on a GPU host then needs no TCP, no keys and no discovery:
the daemon is started with the given `jevany-daemon serve` arguments and
binds an ipc socket in a fresh 0700 directory, the run waits until it is
ready (a model loads for as long as it takes, up to --serve-timeout), and
at exit it gets SIGTERM, which drains it: nothing accepted is dropped. Its
log goes to DAEMON.log beside the results. jevany-client does not depend on
jevany-daemon: the command is `jevany-daemon` on PATH, else this Python's
`-m jevany_daemon`.

While it loads, the run says so (on stderr, through `say`): that it is
starting it, a line every NOTE_EVERY_S once loading takes over NOTE_AFTER_S,
and how long it took once ready; the progress bar starts only then.
"""

import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import JevanyError
from .errors import EvalError

POLL_S = 0.2
STOP_WITHIN_S = 120.0        # a drain answers what is in flight; a stuck one is killed after this
LOG_TAIL = 2000
NOTE_AFTER_S = 5.0           # a load shorter than this gets no "still loading" line
NOTE_EVERY_S = 10.0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class PrivateDaemon:
    def __init__(self, serve_args: str, log_path: str, ready_within_s: float,
                 say: Callable[[str], None] = _to_stderr):
        try:
            self.args = shlex.split(serve_args)
        except ValueError as exc:
            raise EvalError(f"--serve: {exc}") from None
        for flag in ("--bind", "--control"):
            if any(a == flag or a.startswith(flag + "=") for a in self.args):
                raise EvalError(f"--serve: {flag} is chosen by jevany-eval (a private ipc socket)")
        self.log_path = Path(log_path)
        self.ready_within_s = ready_within_s
        self.say = say
        self.dir = Path(tempfile.mkdtemp(prefix="jevany-eval-"))     # 0700: this job's alone
        self.endpoint = f"ipc://{self.dir}/daemon.sock"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "PrivateDaemon":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        command = [*_daemon_command(), "serve", *self.args, "--bind", self.endpoint, "--control", ""]
        self.say(f"starting a daemon for this run (jevany-daemon serve {shlex.join(self.args)}): "
                 f"waiting for it to load; its log: {self.log_path}")
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(started)
        self.say(f"daemon ready in {time.monotonic() - started:.1f} s")

    def _wait_ready(self, started: float) -> None:
        from ..client import JevClient

        deadline = started + self.ready_within_s
        next_note = started + NOTE_AFTER_S
        with JevClient(self.endpoint, timeout=2.0, retries=0) as client:
            while time.monotonic() < deadline:
                if time.monotonic() >= next_note:
                    self.say(f"still waiting for the daemon to load: {time.monotonic() - started:.0f} s of "
                             f"{self.ready_within_s:g} s (--serve-timeout); its log: {self.log_path}")
                    next_note += NOTE_EVERY_S
                if self.proc.poll() is not None:
                    raise EvalError(f"the private daemon exited {self.proc.returncode} before it was ready; "
                                    f"its log ({self.log_path}) ends:\n{self._log_tail()}")
                try:
                    if client.status()["state"] == "ready":
                        return
                except JevanyError:
                    pass           # no socket file yet, or no reply yet: still starting
                time.sleep(POLL_S)   # polling a loading daemon; its log says why if it never comes
        raise EvalError(f"the private daemon was not ready within {self.ready_within_s:g}s (--serve-timeout); "
                        f"its log ({self.log_path}) ends:\n{self._log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)      # the daemon's drain
            try:
                self.proc.wait(STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL:]
        except OSError:
            return "(no log)"


def _daemon_command() -> list[str]:
    found = shutil.which("jevany-daemon")
    if found:
        return [found]
    if importlib.util.find_spec("jevany_daemon") is not None:
        return [sys.executable, "-m", "jevany_daemon"]
    raise EvalError("--serve needs jevany-daemon (pip install jevany-daemon); it is not installed here")


def log_path_for(out: str) -> str:
    root, ext = os.path.splitext(out)
    return f"{root if ext == '.jsonl' else out}.daemon.log"
