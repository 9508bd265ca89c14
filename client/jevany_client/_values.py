"""Shared walk over decoded msgpack values: types, keys, finiteness, depth.

The walk keeps its own stack, so a hostile payload can never exhaust Python's.
Paths are built only when a problem is found: a linked chain of (parent, step)
tuples costs one small tuple per value on the happy path.
"""

import math
from typing import Any

from msgpack import ExtType, Timestamp

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1  # msgpack carries int64 and uint64, nothing wider
_SCALARS = (str, int, bool, type(None))
_SEGMENT_CHARS = 60
_PATH_CHARS = 240
_INT_PROBLEM = "integers must fit in 64 bits"


class UnhashableKey:
    """Stands in for an array or map used as a map key, so decoding can finish and
    the key can be reported as a field error instead of crashing the decoder."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def build_map(pairs: list[tuple[Any, Any]]) -> dict:
    try:
        return dict(pairs)
    except TypeError:
        return {_hashable_key(k): v for k, v in pairs}


def _hashable_key(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        return UnhashableKey(key)
    return key


def wire_type(value: Any) -> str:
    if isinstance(value, UnhashableKey):
        return wire_type(value.value)
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bin"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "map"
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind.__name__
    return type(value).__name__


def format_path(node: tuple | None, root: str) -> str:
    steps = []
    while node is not None:
        node, step = node
        steps.append(step)
    text = root
    for step in reversed(steps):
        if isinstance(step, int):
            text += f"[{step}]"
        else:
            text += f".{shorten(step)}" if text else shorten(step)
    if len(text) > _PATH_CHARS:  # 64 levels of long keys would make a huge message
        text = text[: _PATH_CHARS // 2] + "..." + text[-_PATH_CHARS // 2 :]
    return text or "body"


def shorten(text: str, limit: int = _SEGMENT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def find_problem(
    value: Any,
    root: str,
    *,
    outer_depth: int = 0,
    max_depth: int | None = None,
    finite: bool = True,
) -> tuple[str, str] | None:
    """First (path, problem) in document order, or None when the value is clean.

    Depth counts containers: a container directly inside `outer_depth` others
    sits at level outer_depth + 1.
    """
    stack: list[tuple[Any, tuple | None, int]] = [(value, None, outer_depth + 1)]
    while stack:
        item, node, depth = stack.pop()
        if _is_container(item):
            problem = _container_problem(item, depth, max_depth)
            if problem is None:
                stack.extend(_children(item, node, depth))
                continue
        else:
            problem = _scalar_problem(item, finite)
        if problem is not None:
            return format_path(node, root), problem
    return None


def _is_container(item: Any) -> bool:
    # ExtType is a namedtuple, so it must not pass for an array.
    return isinstance(item, (dict, list, tuple)) and not isinstance(item, ExtType)


def _container_problem(item: dict | list | tuple, depth: int, max_depth: int | None) -> str | None:
    if max_depth is not None and depth > max_depth:
        return f"nests deeper than {max_depth} levels"
    if isinstance(item, dict):
        for key in item:
            if type(key) is not str:
                return f"map keys must be strings, got {wire_type(key)}"
    return None


def _children(item: dict | list | tuple, node: tuple | None, depth: int) -> list[tuple]:
    pairs = item.items() if isinstance(item, dict) else enumerate(item)
    # Reversed so the stack pops them in document order.
    return [(child, (node, step), depth + 1) for step, child in reversed(list(pairs))]


def _scalar_problem(item: Any, finite: bool) -> str | None:
    # Exact types: subclasses (IntEnum, numpy scalars) render differently under str().
    kind = type(item)
    if kind in _SCALARS:
        return None if kind is not int or _INT_MIN <= item <= _INT_MAX else _INT_PROBLEM
    if kind is float:
        return None if not finite or math.isfinite(item) else f"numbers must be finite, got {item}"
    if isinstance(item, (bytes, bytearray, memoryview)):
        return "bin values are not allowed; send text as a msgpack str"
    if isinstance(item, (ExtType, Timestamp)):
        return "msgpack extension types are not allowed"
    return f"unsupported value of type {kind.__name__}"
