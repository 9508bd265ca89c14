"""What AsyncJevClient's calls wait on: one request sent, its future, and what may happen to it."""
import asyncio

from .errors import JevanyError
from .fleet import Peer

CLOSED = object()    # what a pending call's future holds when the client was closed under it


class Awaited:
    """One request sent (or being sent) whose reply has not come yet."""

    __slots__ = ("future", "payload", "key", "resends_left", "sent", "peer", "resend", "unattributed")

    def __init__(self, future: asyncio.Future, payload: bytes, resends: int, key: str | None) -> None:
        self.future = future
        self.payload = payload
        self.key = key                                # its affinity key, for routing=affinity
        self.resends_left = resends
        self.sent = False
        self.peer: Peer | None = None                 # the daemon holding it now
        self.resend: asyncio.Future | None = None     # a send again after a connection dropped
        self.unattributed: JevanyError | None = None  # an error reply no id could be read from


def consume(future: asyncio.Future) -> None:
    # A resend that failed or was cancelled needs no one's attention; its call times out.
    if not future.cancelled():
        future.exception()


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
