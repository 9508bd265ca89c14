"""Messages between the supervisor and its workers (msgpack lists, over an ipc ROUTER/DEALER pair).

worker → supervisor:  [HELLO, {"pid", "model", "load_s"}]  loaded, ready for work
                      [EARLY, [[tag, ok, payload]...], stats, batches]
                                                          answers from one pass of a hand-over that needs
                                                          more; still busy with the rest
                      [RESULTS, [[tag, ok, payload]...], stats, batches]
                                                          the hand-over's remaining answers; ready again.
                                                          batches: [[size, padded_tokens, real_tokens,
                                                          latency_ms, ok, origins]...], the passes since the last
                                                          message; origins: the transports its requests came by
                      [FAILED, message]                   could not load the model
                      [CLEARED, entries, prefix_cache]    emptied its prefix cache, which held that many;
                                                          its statistics now
heartbeat socket   →  [HEARTBEAT]                         alive; sent every interval by a thread, from the
                                                          worker's identity + "/hb", while it scores too
supervisor → worker:  [BATCH, [[tag, payload, transport, media, tenant]...]]
                                                          everything it takes at once (request messages as
                                                          received; transport: zmq or http; media: the
                                                          checked files [[type, path, [size, sha256]]...], or null;
                                                          tenant: the prefix-cache salt, or null)
                      [STOP]                              finish and exit
                      [CLEAR]                             empty the prefix cache (after any batch in hand)
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

HEARTBEAT_MAX_INTERVAL_S = 1.0
HEARTBEAT_SUFFIX = b"/hb"     # the heartbeat socket's identity: the worker's plus this


def heartbeat_interval(heartbeat_timeout: float) -> float:
    """Several beats fit in the timeout, so one late beat never kills a healthy worker."""
    return min(HEARTBEAT_MAX_INTERVAL_S, heartbeat_timeout / 4)


def encode(kind: str, *args) -> bytes:
    return msgpack.packb([kind, *args], use_bin_type=True)


def decode(payload: bytes) -> list:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)
