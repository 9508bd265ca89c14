"""A withdrawal: the gateway's word to the supervisor that an HTTP caller closed its connection before
its answer came, so its request, if still queued, is dropped unscored as a departed ZeroMQ client's is.

It travels only on the gateway's private socket and is not a protocol op: no client can send one
(on a public socket it is an unreadable message like any other). It is the request's gateway id
after a byte msgpack never uses (0xc1), so no protocol message can be read as one, and the
supervisor tells the two apart by their first byte before decoding anything.
"""
import msgpack

MARK = b"\xc1"


def encode(request_id: int) -> bytes:
    return MARK + msgpack.packb(request_id)


def decode(payload: bytes) -> int | None:
    """The withdrawn request's gateway id; None for any other message (a protocol one)."""
    if not payload.startswith(MARK):
        return None
    try:
        request_id = msgpack.unpackb(payload[len(MARK):])
    except ValueError:
        return None
    return request_id if isinstance(request_id, int) and not isinstance(request_id, bool) else None
