"""Version 1 of the wire envelope: strict request decoding, replies, and packing."""

import io
from dataclasses import dataclass
from typing import Any

import msgpack

from ._values import build_map, find_problem, shorten
from .errors import (
    InvalidMessageError,
    InvalidRequestError,
    JevanyError,
    UnknownOpError,
    UnsupportedVersionError,
)

PROTOCOL_VERSION = 1
PUBLIC_OPS = ("decide", "ping", "status", "models")
CONTROL_OPS = ("clear_cache", "drain", "reload")
MAX_ID_BYTES = 256
MAX_SAFE_INT = 2**53 - 1
MAX_DEPTH = 64
# What one message may hold, whatever its size: a value costs the decoder a
# Python object (and a map or an array a call and tens of bytes more), so an
# 8 MiB message of 8 million empty maps would cost gigabytes and seconds. No
# decision request comes near these: a state fitting any context window holds
# fewer values than it has tokens.
MAX_VALUES = 1 << 20        # map pairs plus array items, anywhere in the message
MAX_CONTAINERS = 1 << 16    # maps plus arrays

_REQUEST_KEYS = frozenset(("v", "id", "op", "body", "timeout_ms"))
_OPS = frozenset(PUBLIC_OPS + CONTROL_OPS)


@dataclass(frozen=True)
class Request:
    v: int
    id: str | int
    op: str
    body: dict | None
    timeout_ms: int | None


class _ExtensionFound(Exception):
    pass


class _TooMany(Exception):
    pass


def _reject_extension(code: int, data: bytes) -> None:
    raise _ExtensionFound(code)


class _Budget:
    """Counts what the decoder builds, and stops it once a message holds more than the caps.

    The decoder calls these hooks as each map and array is complete, so a
    message past a cap costs at most the caps' worth of objects, not its
    header's or its bytes' worth.

    They also note, at C speed (a set of types per container), whether the
    message holds a map key that is not a str or a bin value: the only
    problems a walk (_values.find_problem) can find in what this decoder
    builds with finiteness left aside (extensions are refused while decoding,
    and msgpack carries no integer wider than 64 bits). A message without
    either is clean, and the walk, a Python loop over every value, is skipped.
    """

    __slots__ = ("values", "containers", "noting", "odd")

    def __init__(self, noting: bool = False) -> None:
        self.values = self.containers = 0
        self.noting = noting  # only a caller that skips the walk on it pays for the note
        self.odd = False      # a key that is not a str, or a bin value: walk to say where

    # Counted inline: these run once per map and array of every message.
    def map(self, pairs: list) -> dict:
        self.values += len(pairs)
        self.containers += 1
        if self.values > MAX_VALUES or self.containers > MAX_CONTAINERS:
            raise _TooMany()
        built = build_map(pairs)
        if self.noting and not self.odd and (not _STR_ONLY.issuperset(map(type, built))
                             or not _NO_BIN.isdisjoint(map(type, built.values()))):
            self.odd = True
        return built

    def array(self, items: list) -> list:
        self.values += len(items)
        self.containers += 1
        if self.values > MAX_VALUES or self.containers > MAX_CONTAINERS:
            raise _TooMany()
        if self.noting and not self.odd and not _NO_BIN.isdisjoint(map(type, items)):
            self.odd = True
        return items


_STR_ONLY = frozenset((str,))
_NO_BIN = frozenset((bytes,))        # what msgpack's bin decodes to


def _too_many_problem() -> str:
    return (f"message holds more than {MAX_VALUES:,} values or {MAX_CONTAINERS:,} maps and arrays; "
            "no decision request needs that many")


# unpackb sizes every str/bin/array/map limit from len(payload), so a header
# cannot claim more than the payload holds; the C decoder also stops at 1024
# levels of nesting with StackError instead of recursing. max_ext_len=0 makes
# the timestamp extension (-1), which never reaches ext_hook, fail as well.
_STRICT = dict(
    raw=False,
    strict_map_key=False,  # non-str keys are decoded so they can be reported by path
    ext_hook=_reject_extension,
    max_ext_len=0,
)
# Used only after the strict pass failed, to find an id worth echoing.
_LENIENT = dict(
    raw=False,
    strict_map_key=False,
    ext_hook=lambda code, data: None,
    unicode_errors="surrogateescape",
)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(payload: bytes) -> Any:
    return _unpack_noting(payload, noting=False)[0]


def _unpack_noting(payload: bytes, noting: bool = True) -> tuple[Any, _Budget]:
    """The decoded message, and its budget: what it holds, and (noting) whether a walk could find a problem."""
    budget = _Budget(noting)
    try:
        return msgpack.unpackb(payload, object_pairs_hook=budget.map, list_hook=budget.array, **_STRICT), budget
    except _TooMany:
        raise InvalidRequestError(_too_many_problem(), request_id=_salvage_id(payload)) from None
    except Exception as exc:  # the decoder raises many types; all mean the same here
        raise InvalidMessageError(_decode_problem(exc), request_id=_salvage_id(payload)) from None


def _decode_problem(exc: Exception) -> str:
    if isinstance(exc, msgpack.ExtraData):
        return "payload holds trailing bytes after one msgpack object"
    if isinstance(exc, msgpack.StackError):
        return "payload nests deeper than the msgpack decoder allows"
    if isinstance(exc, _ExtensionFound) or "max_ext_len" in str(exc):
        return "msgpack extension types are not allowed"
    if isinstance(exc, UnicodeDecodeError):
        return "a str value is not valid UTF-8"
    return f"payload is not valid msgpack ({shorten(str(exc) or type(exc).__name__, 120)})"


def _salvage_id(payload: bytes) -> str | int | None:
    """The id of a message that failed to decode, when its top-level map still reads whole.

    Values other than the id are skipped without being built (the decoder's
    own skip), so a message refused for its size or its counts costs no more
    here than its bytes; keys and the id are decoded under the caps.
    """
    budget = _Budget()
    unpacker = msgpack.Unpacker(object_pairs_hook=budget.map, list_hook=budget.array,
                                max_buffer_size=max(len(payload), 1), **_LENIENT)
    unpacker.feed(payload)
    found = None
    try:
        for _ in range(min(unpacker.read_map_header(), MAX_KEYS)):   # a request's id is among its few keys
            if unpacker.unpack() == "id":
                found = unpacker.unpack()     # a later duplicate wins, as when decoding
            else:
                unpacker.skip()
    except Exception:  # truncated, not a map, past the caps: no id worth trusting
        return None
    return found if _id_problem(found) is None else None


def _id_problem(value: Any) -> str | None:
    if type(value) is int:
        return None if -MAX_SAFE_INT <= value <= MAX_SAFE_INT else "id is outside ±(2^53 − 1)"
    if type(value) is not str:
        return "id must be a str or an int"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "id is not valid UTF-8"
    return None if size <= MAX_ID_BYTES else f"id is longer than {MAX_ID_BYTES} bytes"


def decode_request(payload: bytes) -> Request:
    obj = _unpack(payload)
    if not isinstance(obj, dict):
        raise InvalidMessageError("message must be a msgpack map")
    return _request(obj, obj.get("body"))


def decode_envelope(payload: bytes, body_keys: frozenset = frozenset()) -> Request:
    """The message checked as decode_request checks it, but for its body: only body_keys are decoded.

    For a loop that must spend no more on a message than its bytes' worth at C
    speed, whatever their shape: the decoder's skip builds nothing, where
    decoding 4 MB of small maps builds a million objects (0.17 s) and checking
    them costs as much again. The body is checked to be a map; what else it
    holds (types, finiteness, the caps, valid UTF-8) is left to decode_request
    wherever the body is used. A value that should be a scalar (v, id, op,
    timeout_ms) and is a container is skipped and refused for its type.
    """
    budget = _Budget()
    # Read from the bytes in place (a BytesIO of bytes shares them), not fed: feeding copies them whole.
    unpacker = msgpack.Unpacker(io.BytesIO(payload), object_pairs_hook=budget.map, list_hook=budget.array,
                                max_buffer_size=max(len(payload), 1), **_STRICT)
    try:
        obj, body = _envelope(unpacker, payload, body_keys)
        if unpacker.tell() != len(payload):
            raise msgpack.ExtraData(None, None)
    except JevanyError:
        raise
    except _TooMany:
        raise InvalidRequestError(_too_many_problem(), request_id=_salvage_id(payload)) from None
    except _NotAMap:
        raise InvalidMessageError("message must be a msgpack map") from None
    except Exception as exc:  # the decoder raises many types; all mean the same here
        raise InvalidMessageError(_decode_problem(exc), request_id=_salvage_id(payload)) from None
    return _request(obj, body)


class _NotAMap(Exception):
    pass


class _Overfull(list):
    """A map with more keys than any request has, skipped whole: refused once the id is known."""

    def __init__(self, where: str, n: int) -> None:
        super().__init__()
        self.problem = f"{where} holds {n:,} keys, more than any request has ({MAX_KEYS})"


# How many keys a request's top-level map and its body may hold: a request has
# five and a body four (schema.py), so no more are read one by one.
MAX_KEYS = 16
_MAPS = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))
_CONTAINERS = _MAPS | frozenset((*range(0x90, 0xA0), 0xDC, 0xDD))
_NIL = 0xC0


def _peek(unpacker, payload: bytes) -> int | None:
    """The type byte of the next value; None past the end (decoding it then says the payload is truncated)."""
    at = unpacker.tell()
    return payload[at] if at < len(payload) else None


def _map_len(payload: bytes, at: int) -> int | None:
    """The pair count of the map header at payload[at], read without decoding; None when it is not a map."""
    kind = payload[at] if at < len(payload) else None
    if kind is None:
        return None
    if 0x80 <= kind <= 0x8F:
        return kind & 0x0F
    if kind in (0xDE, 0xDF):
        return int.from_bytes(payload[at + 1:at + (3 if kind == 0xDE else 5)], "big")
    return None


def _envelope(unpacker, payload: bytes, body_keys: frozenset) -> tuple[dict, Any]:
    """The top-level map with its body's values skipped but for body_keys (a body that is not a map: [])."""
    n = _map_len(payload, 0)
    if n is None:
        unpacker.skip()          # still invalid msgpack first, if it is
        raise _NotAMap()
    if n > MAX_KEYS:
        unpacker.skip()
        raise InvalidMessageError(_Overfull("message", n).problem, request_id=_salvage_id(payload))
    pairs, body = [], None
    for _ in range(unpacker.read_map_header()):
        key = _scalar(unpacker, payload)
        if key == "body":
            body = _kept(unpacker, payload, body_keys)
            pairs.append((key, body))
        elif type(key) is str and key in _REQUEST_KEYS:
            pairs.append((key, _scalar(unpacker, payload)))
        else:                    # refused anyway: an unknown key, or one that is not a str
            unpacker.skip()
            pairs.append((key, None))
    return build_map(pairs), body


def _scalar(unpacker, payload: bytes) -> Any:
    """The next value when it is a scalar; a container is skipped, unbuilt, and stands as [] (refused for its type)."""
    if _peek(unpacker, payload) in _CONTAINERS:
        unpacker.skip()
        return []
    return unpacker.unpack()


def _kept(unpacker, payload: bytes, body_keys: frozenset) -> Any:
    at = unpacker.tell()
    if _peek(unpacker, payload) in (_NIL, None):
        return unpacker.unpack()
    n = _map_len(payload, at)
    if n is None or n > MAX_KEYS:
        unpacker.skip()
        return [] if n is None else _Overfull("body", n)     # refused by _request, with the id
    kept = {}
    for _ in range(unpacker.read_map_header()):
        key = _scalar(unpacker, payload)
        if type(key) is str and key in body_keys:
            kept[key] = unpacker.unpack()
        else:
            unpacker.skip()
    return kept


def _request(obj: dict, body: Any) -> Request:
    """The checks every request passes, in their order: the id, the version, the keys, op, body, timeout."""
    if "id" not in obj:
        raise InvalidMessageError("message has no id")
    problem = _id_problem(obj["id"])
    if problem is not None:
        raise InvalidMessageError(problem)
    request_id = obj["id"]
    # The version decides what the rest means, so it is checked before anything else.
    v = _version(obj, request_id)
    _check_envelope_keys(obj, request_id)
    op = _op(obj, request_id)
    body = _body(body, op, request_id)
    timeout_ms = _timeout(obj.get("timeout_ms"), request_id)
    return Request(v=v, id=request_id, op=op, body=body, timeout_ms=timeout_ms)


def _version(obj: dict, request_id: str | int) -> int:
    if "v" not in obj:
        raise InvalidMessageError("message has no v", request_id=request_id)
    v = obj["v"]
    if type(v) is not int:
        raise InvalidMessageError("v must be an int", request_id=request_id)
    if v != PROTOCOL_VERSION:
        raise UnsupportedVersionError(
            f"protocol version {v} is not supported; this side speaks {PROTOCOL_VERSION}",
            request_id=request_id,
        )
    return v


def _check_envelope_keys(obj: dict, request_id: str | int) -> None:
    for key in obj:
        if type(key) is not str:
            raise InvalidMessageError("message keys must be strings", request_id=request_id)
    # Rejected rather than ignored: a misspelt timeout_ms would otherwise vanish silently.
    unknown = sorted(set(obj) - _REQUEST_KEYS)
    if unknown:
        shown = [shorten(k) for k in unknown[:10]]
        raise InvalidMessageError(f"unknown message keys: {shown}", request_id=request_id)


def _op(obj: dict, request_id: str | int) -> str:
    if "op" not in obj:
        raise InvalidMessageError("message has no op", request_id=request_id)
    op = obj["op"]
    if type(op) is not str:
        raise InvalidMessageError("op must be a str", request_id=request_id)
    if op not in _OPS:
        raise UnknownOpError(f"unknown op {shorten(op)!r}", request_id=request_id)
    return op


def _body(body: Any, op: str, request_id: str | int) -> dict | None:
    if isinstance(body, _Overfull):
        raise InvalidRequestError(body.problem, request_id=request_id)
    if body is not None and not isinstance(body, dict):
        raise InvalidRequestError("body must be a map", request_id=request_id)
    if body is None and op == "decide":
        raise InvalidRequestError("decide needs a body map", request_id=request_id)
    return body


def _timeout(value: Any, request_id: str | int) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INT:
        raise InvalidRequestError(
            f"timeout_ms must be an int from 0 to {MAX_SAFE_INT}", request_id=request_id
        )
    return value


def encode_request(
    id: str | int,
    op: str,
    body: dict | None = None,
    timeout_ms: int | None = None,
) -> bytes:
    problem = _id_problem(id)
    if problem is not None:
        raise InvalidMessageError(problem)
    message: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": id, "op": op}
    if body is not None:
        message["body"] = body
    if timeout_ms is not None:
        message["timeout_ms"] = _timeout(timeout_ms, id)
    return pack(message)


def ok_reply(id: str | int | None, result: dict) -> dict:
    return {"v": PROTOCOL_VERSION, "id": id, "ok": True, "result": result}


def error_reply(id: str | int | None, err: JevanyError) -> dict:
    return {"v": PROTOCOL_VERSION, "id": id, "ok": False, "error": err.to_wire()}


def decode_reply(payload: bytes) -> dict:
    reply, budget = _unpack_noting(payload)
    if not isinstance(reply, dict):
        raise InvalidMessageError("reply must be a msgpack map")
    if "id" not in reply:
        raise InvalidMessageError("reply has no id")
    request_id = reply["id"]
    if request_id is not None and _id_problem(request_id) is not None:
        raise InvalidMessageError(f"reply id is invalid: {_id_problem(request_id)}")
    v = reply.get("v")
    if type(v) is not int:
        raise InvalidMessageError("reply has no int v", request_id=request_id)
    if v != PROTOCOL_VERSION:
        raise UnsupportedVersionError(f"reply speaks protocol {v}", request_id=request_id)
    _check_reply_shape(reply, request_id, walk=budget.odd)
    return reply


def _check_reply_shape(reply: dict, request_id: str | int | None, walk: bool = True) -> None:
    ok = reply.get("ok")
    if type(ok) is not bool:
        raise InvalidMessageError("reply ok must be a bool", request_id=request_id)
    if ok and not isinstance(reply.get("result"), dict):
        raise InvalidMessageError("ok reply has no result map", request_id=request_id)
    if not ok and not _is_wire_error(reply.get("error")):
        raise InvalidMessageError(
            "error reply needs error {code: str, message: str, retryable: bool}",
            request_id=request_id,
        )
    # Depth is left to the decoder's own bound: results echo request values
    # (score legends) a few levels below where the request held them. Only a
    # reply the decoder saw something odd in can hold a problem (_Budget).
    found = find_problem(reply, "reply", finite=False) if walk else None
    if found is not None:
        raise InvalidMessageError(f"{found[0]}: {found[1]}", request_id=request_id)


def _is_wire_error(error: Any) -> bool:
    return (
        isinstance(error, dict)
        and type(error.get("code")) is str
        and type(error.get("message")) is str
        and type(error.get("retryable")) is bool
    )
