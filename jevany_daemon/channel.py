"""Messages between the supervisor and its workers (msgpack lists, over an ipc ROUTER/DEALER pair).

worker → supervisor:  [HELLO, {"pid", "model", "load_s"}]  loaded, ready for work
                      [EARLY, [Answer...], stats, batches, seq]
                                                          answers from one pass; the worker still holds
                                                          more (queued, or a pass on the device)
                      [RESULTS, [Answer...], stats, batches, seq]
                                                          answers, and nothing more held: idle once seq is
                                                          the last hand-over sent (a later one may still be
                                                          on its way). batches: [PassRecord...], the passes
                                                          since the last message; seq: the last hand-over
                                                          the worker had read
                      [FAILED, message]                   could not load the model
                      [CLEARED, entries, prefix_cache]    emptied its prefix cache, which held that many;
                                                          its statistics now
heartbeat socket   →  [HEARTBEAT]                         alive; sent every interval by a thread, from the
                                                          worker's identity + "/hb", while it scores too
supervisor → worker:  [BATCH, [HandedOver...], seq]    a hand-over, numbered from 1: requests as received,
                                                          each with what the worker needs of it (the fields
                                                          below). Sent to a free worker, or to a busy one as
                                                          its next pass's worth
                      [STOP]                              finish what is held and exit
                      [CLEAR]                             empty the prefix cache (after any pass in hand)

Each record inside a message is a NamedTuple below, written by one end and
read by the other under the same names; msgpack carries it as a list.
"""
from typing import Any, NamedTuple

import msgpack

HELLO, EARLY, RESULTS, FAILED, HEARTBEAT, BATCH, STOP, CLEAR, CLEARED = (
    "hello", "early", "results", "failed", "heartbeat", "batch", "stop", "clear", "cleared")

# A worker that fails to load its model exits with this, so the supervisor
# stops with the worker's message instead of restarting it in a loop.
EXIT_LOAD_FAILED = 3
# A worker whose device failed beyond recovery (a CUDA error other than out of
# memory) exits with this; it is replaced like any worker that died.
EXIT_DEVICE_LOST = 4
# A worker whose settings cannot work with its model (a shape plan that would warm longer than
# --warmup-limit) exits with this: the daemon stops as for any settings error, exit 2.
EXIT_SETTINGS = 5

HEARTBEAT_MAX_INTERVAL_S = 1.0
HEARTBEAT_SUFFIX = b"/hb"     # the heartbeat socket's identity: the worker's plus this


class HandedOver(NamedTuple):
    """One request of a BATCH hand-over: the supervisor writes it, the worker reads it (HandedOver.read)."""
    tag: int
    payload: bytes
    transport: str | None = None
    media: list | None = None        # the checked files, [[type, path, [size, sha256]]...]
    left: float | None = None        # seconds to its deadline as it was sent
    tenant: str | None = None        # the prefix-cache salt
    sent_at: float | None = None     # the host's time.monotonic() as it was sent, from which left counts

    @classmethod
    def read(cls, item: list) -> "HandedOver":
        return cls(*item)            # fields a sender left off the end read as None


class PassRecord(NamedTuple):
    """One pass a worker ran, sent with its answers (EARLY, RESULTS) for the supervisor's statistics."""
    size: int
    padded_tokens: int
    real_tokens: int
    latency_ms: float
    ok: bool = False
    origins: list | tuple = ()       # the transports its requests came by

    @classmethod
    def read(cls, record: list) -> "PassRecord":
        return cls(*record)


class Answer(NamedTuple):
    """One request's outcome in EARLY and RESULTS: its tag, and its result or its error's wire form."""
    tag: int
    ok: bool
    payload: Any


def heartbeat_interval(heartbeat_timeout: float) -> float:
    """Several beats fit in the timeout, so one late beat never kills a healthy worker."""
    return min(HEARTBEAT_MAX_INTERVAL_S, heartbeat_timeout / 4)


def encode(kind: str, *args) -> bytes:
    return msgpack.packb([kind, *args], use_bin_type=True)


def decode(payload: bytes) -> list:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)
