"""Client processes for the concurrency tests (imported by spawned interpreters)."""
from jevany_client import JevClient, JevanyError


def stream(endpoint: str, bodies: list, start: int, queue, barrier=None) -> None:
    """Send requests one after another; report (index, id echoed, result) for each.

    With a barrier, the first request waits until every party is connected and ready.
    """
    out = []
    with JevClient(endpoint, timeout=120) as client:
        if barrier is not None:
            client.ping()
            barrier.wait(120)
        for i, body in enumerate(bodies):
            reply_id = f"p{start}-{i}"
            result = client.call("decide", body)
            out.append((start + i, reply_id, result))
    queue.put(out)


def outcome(result) -> str:
    return result.code if isinstance(result, JevanyError) else "ok"


def pipelined(endpoint: str, bodies: list, name: str, queue) -> None:
    """Send every body at once (no retries, so each reply is what the daemon said); report outcome codes."""
    with JevClient(endpoint, timeout=120, retries=0) as client:
        results = client.decide_many(bodies, return_exceptions=True)
    queue.put((name, [outcome(r) for r in results]))


def until_stopped(endpoint: str, bodies: list, name: str, stop, queue, pause_s: float = 0.0) -> None:
    """Send bodies in turn, one at a time, until stop is set; report (outcome, model) per request.

    pause_s paces the stream (load shaping, so a 2-core machine has room left to load a model).
    """
    seen = []
    with JevClient(endpoint, timeout=120, retries=0) as client:
        i = 0
        while not stop.wait(pause_s) or len(seen) < 2:
            try:
                result = client.call("decide", bodies[i % len(bodies)])
                seen.append(("ok", result["model"]))
            except JevanyError as err:
                seen.append((err.code, err.message))
            i += 1
    queue.put((name, seen))
