"""Shared walk over decoded msgpack values: types, keys, finiteness, depth.

The walk keeps its own stack, so a hostile payload can never exhaust Python's,
and that stack holds one iterator per open container, so its memory follows
the depth, not the size. Paths are a linked chain of (parent, step) tuples,
one per container entered, formatted only when a problem is found.
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
_PLAIN = frozenset((str, bool, type(None)))
_INTS = frozenset((int,))
_FLOATS = frozenset((float,))


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
    problem = _problem(value, outer_depth + 1, max_depth, finite)
    if problem is not None:
        return format_path(None, root), problem
    if not _needs_walk(value, finite):
        return None
    # One lazy iterator per open container, so memory follows the depth (at
    # most max_depth frames) rather than the size: an 8 MiB array of
    # 8 million small values must not allocate a path tuple per element.
    stack: list[tuple[Any, tuple | None, int]] = [(_items(value), None, outer_depth + 2)]
    while stack:
        pairs, node, depth = stack[-1]
        for step, child in pairs:
            if type(child) is str:   # most values; skips a call per value
                continue
            problem = _problem(child, depth, max_depth, finite)
            if problem is not None:
                return format_path((node, step), root), problem
            if _needs_walk(child, finite):
                stack.append((_items(child), (node, step), depth + 1))
                break
        else:
            stack.pop()
    return None


def _problem(item: Any, depth: int, max_depth: int | None, finite: bool) -> str | None:
    if _is_container(item):
        return _container_problem(item, depth, max_depth)
    return _scalar_problem(item, finite)


def _needs_walk(item: Any, finite: bool) -> bool:
    return bool(item) and _is_container(item) and not _flat_and_clean(item, finite)


def _is_container(item: Any) -> bool:
    kind = type(item)
    if kind is list or kind is dict:
        return True
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


def _flat_and_clean(item: dict | list | tuple, finite: bool) -> bool:
    """True when every value in the container is a scalar without a problem, found at C speed.

    A quick answer for the long flat arrays and maps that big payloads are made
    of; anything mixed or nested returns False and is walked value by value.
    """
    values = item.values() if isinstance(item, dict) else item
    kinds = set(map(type, values))
    if kinds <= _PLAIN:
        return True
    if kinds == _INTS:
        return _INT_MIN <= min(values) and max(values) <= _INT_MAX
    if kinds == _FLOATS:
        return not finite or all(map(math.isfinite, values))
    return False


def _items(item: dict | list | tuple):
    return iter(item.items()) if isinstance(item, dict) else enumerate(item)


def _scalar_problem(item: Any, finite: bool) -> str | None:
    # Exact types: subclasses (IntEnum, numpy scalars) render differently under str().
    kind = type(item)
    if kind is str or item is None or kind is bool:
        return None
    if kind in _SCALARS:
        return None if kind is not int or _INT_MIN <= item <= _INT_MAX else _INT_PROBLEM
    if kind is float:
        return None if not finite or math.isfinite(item) else f"numbers must be finite, got {item}"
    if isinstance(item, (bytes, bytearray, memoryview)):
        return "bin values are not allowed; send text as a msgpack str"
    if isinstance(item, (ExtType, Timestamp)):
        return "msgpack extension types are not allowed"
    return f"unsupported value of type {kind.__name__}"
