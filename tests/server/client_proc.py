"""Client processes for the concurrency tests (imported by spawned interpreters)."""
from jevany_client import JevClient


def stream(endpoint: str, bodies: list, start: int, queue) -> None:
    """Send requests one after another; report (index, id echoed, result) for each."""
    out = []
    with JevClient(endpoint, timeout=120) as client:
        for i, body in enumerate(bodies):
            reply_id = f"p{start}-{i}"
            result = client.call("decide", body)
            out.append((start + i, reply_id, result))
    queue.put(out)
