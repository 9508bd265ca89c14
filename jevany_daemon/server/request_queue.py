"""The bounded queue of decide requests waiting for a worker, and their deadlines."""
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class Entry:
    """One accepted decide request, from arrival until its reply."""
    tag: int                   # the supervisor's handle for it across the worker channel
    sock: Any                  # the ROUTER it came in on; the reply goes back there
    envelope: list             # routing frames to echo before the reply payload
    id: Any                    # the client's request id
    payload: bytes             # the request message as received; the worker takes its body from it
    received: float            # monotonic seconds
    deadline: float | None     # monotonic seconds after which it must not be scored
    transport: str = "zmq"     # zmq, or http through the gateway: counted apart
    media: list | None = None  # its media files as the checker resolved them: [[type, path, stamp]...]
    handover: int = 0          # the hand-over to its worker that carried it (worker_handle.py)
    before_ready: bool = False  # came while the model loaded: its wait is the load's, not the daemon's pace

    @property
    def client(self) -> tuple | None:
        """Who sent it: its socket and routing id (GPU-aware group commit waits for clients, gather.py).
        None through the HTTP gateway: every HTTP request comes on its one connection, so its users
        cannot be told apart, and one of them must not be waited for as if the rest were coming."""
        if self.transport == "http":
            return None
        return id(self.sock), self.envelope[0] if self.envelope else None

    @property
    def tenant(self) -> str | None:
        """Its prefix-cache namespace (tenants.py), from the connection it came on."""
        return getattr(getattr(self.envelope, "peer", None), "tenant", None)


class RequestQueue:
    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self._entries: deque[Entry] = deque()
        self._with_deadline = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)

    @property
    def full(self) -> bool:
        return len(self._entries) >= self.max_depth

    def push(self, entry: Entry) -> None:
        self._entries.append(entry)
        self._with_deadline += entry.deadline is not None

    def take(self, n: int) -> list[Entry]:
        taken = [self._entries.popleft() for _ in range(min(n, len(self._entries)))]
        self._with_deadline -= sum(e.deadline is not None for e in taken)
        return taken

    def withdraw(self, match) -> Entry | None:
        """The first queued entry for which match(entry) holds, taken out of the queue; None if none does."""
        for i, entry in enumerate(self._entries):
            if match(entry):
                del self._entries[i]
                self._with_deadline -= entry.deadline is not None
                return entry
        return None

    def take_expired(self, now: float) -> list[Entry]:
        if not self._with_deadline:
            return []
        expired = [e for e in self._entries if e.deadline is not None and e.deadline <= now]
        if expired:
            gone = set(map(id, expired))
            self._entries = deque(e for e in self._entries if id(e) not in gone)
            self._with_deadline -= len(expired)
        return expired

    def next_deadline(self) -> float | None:
        if not self._with_deadline:
            return None
        return min(e.deadline for e in self._entries if e.deadline is not None)

    def take_all(self) -> list[Entry]:
        return self.take(len(self._entries))
