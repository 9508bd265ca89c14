"""Messages between the supervisor and its workers (msgpack lists, over an ipc ROUTER/DEALER pair).

worker → supervisor:  [HELLO, {"pid", "model", "load_s"}]  loaded, ready for work
                      [EARLY, [[tag, ok, payload]...], stats, batches, seq]
                                                          answers from one pass; the worker still holds
                                                          more (queued, or a pass on the device)
                      [RESULTS, [[tag, ok, payload]...], stats, batches, seq]
                                                          answers, and nothing more held: idle once seq is
                                                          the last hand-over sent (a later one may still be
                                                          on its way). batches: [[size, padded_tokens,
                                                          real_tokens, latency_ms, ok, origins]...], the
                                                          passes since the last message; origins: the
                                                          transports its requests came by; seq: the last
                                                          hand-over the worker had read
                      [FAILED, message]                   could not load the model
                      [CLEARED, entries, prefix_cache]    emptied its prefix cache, which held that many;
                                                          its statistics now
heartbeat socket   →  [HEARTBEAT]                         alive; sent every interval by a thread, from the
                                                          worker's identity + "/hb", while it scores too
supervisor → worker:  [BATCH, [[tag, payload, transport, media, left, tenant, sent_at]...], seq]
                                                          a hand-over, numbered from 1: requests as received
                                                          (transport: zmq or http; media: the checked files
                                                          [[type, path, [size, sha256]]...], or null; left:
                                                          seconds to its deadline, or null; tenant: the
                                                          prefix-cache salt, or null; sent_at: the host's
                                                          time.monotonic() when sent, from which left counts).
                                                          Sent to a free worker, or to a busy one as its next
                                                          pass's worth
                      [STOP]                              finish what is held and exit
                      [CLEAR]                             empty the prefix cache (after any pass in hand)
"""
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


def heartbeat_interval(heartbeat_timeout: float) -> float:
    """Several beats fit in the timeout, so one late beat never kills a healthy worker."""
    return min(HEARTBEAT_MAX_INTERVAL_S, heartbeat_timeout / 4)


def encode(kind: str, *args) -> bytes:
    return msgpack.packb([kind, *args], use_bin_type=True)


def decode(payload: bytes) -> list:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)
