"""Worker processes as the supervisor sees them: spawn, hand over work, notice death."""
import json
import subprocess
import sys
from dataclasses import dataclass, field

from . import channel
from .admission import Entry

STARTING, IDLE, BUSY, STOPPING, DEAD = "starting", "idle", "busy", "stopping", "dead"


@dataclass(eq=False)
class WorkerHandle:
    index: int
    generation: int
    proc: subprocess.Popen
    device: str
    state: str = STARTING
    inflight: dict = field(default_factory=dict)    # tag → Entry, everything it was handed
    restarts: int = 0
    requests: int = 0
    model: dict | None = None      # describe() from its hello
    stats: dict = field(default_factory=dict)       # its engine's batching statistics
    ready_once: bool = False

    @property
    def identity(self) -> bytes:
        return identity(self.index, self.generation)

    def hand_over(self, backend, entries: list[Entry]) -> None:
        self.inflight = {e.tag: e for e in entries}
        self.state = BUSY
        backend.send_multipart([self.identity, channel.encode(channel.BATCH, [[e.tag, e.body] for e in entries])])

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def describe(self) -> dict:
        return {"index": self.index, "pid": self.proc.pid, "device": self.device, "state": self.state,
                "restarts": self.restarts, "requests": self.requests, "inflight": len(self.inflight)}


def identity(index: int, generation: int) -> bytes:
    # A new identity per incarnation: late messages from a dead one can't be mistaken for its successor's.
    return f"w{index}.{generation}".encode()


def spawn(index: int, generation: int, backend: str, settings: dict) -> WorkerHandle:
    proc = subprocess.Popen(
        [sys.executable, "-m", "jevany_daemon.server.worker", "--backend", backend,
         "--identity", identity(index, generation).decode(), "--settings", json.dumps(settings)],
        stdin=subprocess.DEVNULL,
    )
    return WorkerHandle(index, generation, proc, settings["device"])
