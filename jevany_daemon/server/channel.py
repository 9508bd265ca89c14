"""Messages between the supervisor and its workers (msgpack lists, over an ipc ROUTER/DEALER pair).

worker → supervisor:  [HELLO, {"pid", "model"}]          loaded, ready for work
                      [RESULTS, [[tag, ok, payload]...], stats]  answers for a batch; ready again
                      [FAILED, message]                   could not load the model
supervisor → worker:  [BATCH, [[tag, body]...]]           everything it takes at once
                      [STOP]                              finish and exit
"""
import msgpack

HELLO, RESULTS, FAILED, BATCH, STOP = "hello", "results", "failed", "batch", "stop"

# A worker that fails to load its model exits with this, so the supervisor
# stops with the worker's message instead of restarting it in a loop.
EXIT_LOAD_FAILED = 3


def encode(kind: str, *args) -> bytes:
    return msgpack.packb([kind, *args], use_bin_type=True)


def decode(payload: bytes) -> list:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)
