"""Shared walk over decoded msgpack values: types, keys, finiteness, depth.

The walk keeps its own stack, so a hostile payload can never exhaust Python's,
and that stack holds one iterator per open container, so its memory follows
the depth, not the size. Paths are a linked chain of (parent, step) tuples,
one per container entered, formatted only when a problem is found.
"""

import math
from itertools import compress, count, islice, repeat
from operator import indexOf, is_, or_
from typing import Any

from msgpack import ExtType, Timestamp

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1  # msgpack carries int64 and uint64, nothing wider
_SCALARS = (str, int, bool, type(None))
_SEGMENT_CHARS = 60
_PATH_CHARS = 240
_INT_PROBLEM = "integers must fit in 64 bits"
_PLAIN = frozenset((str, bool, type(None)))
_STR_ONLY = frozenset((str,))
_INTS = frozenset((int,))
_FLOATS = frozenset((float,))
_NUMBERS = frozenset((int, float))
_SMALL = 16     # values in a container checked one by one; longer ones pass by pass (_open_long)


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

    Python runs once per container, never once per value: a container's
    scalars are checked by type and range at C speed (_open), so a message's
    cost follows its containers (at most protocol.MAX_CONTAINERS), whatever
    mix of values it holds. A million integers and one bin value cost a
    supervisor's loop 0.65 s when each was visited.
    """
    problem = _problem(value, outer_depth + 1, max_depth, finite)
    if problem is not None:
        return format_path(None, root), problem
    if not _is_container(value):
        return None
    # One frame per open container, so memory follows the depth (at most
    # max_depth frames), not the size.
    stack = [_open(value, None, outer_depth + 2, finite)]
    while stack:
        children, node, depth, bad = stack[-1]
        for step, child in children:
            problem = _problem(child, depth, max_depth, finite)
            if problem is not None:
                return format_path((node, step), root), problem
            stack.append(_open(child, (node, step), depth + 1, finite))
            break
        else:
            stack.pop()
            if bad is not None:       # every container before it was clean
                return format_path((node, bad[0]), root), bad[1]
    return None


def _open(item: dict | list | tuple, node: tuple | None, depth: int, finite: bool) -> tuple:
    """(children, node, depth, bad): the nested containers to walk, in order and before the first
    scalar problem, and that problem as (step, problem) or None."""
    keyed = isinstance(item, dict)
    values = item.values() if keyed else item
    present = set(map(type, values))
    if present <= _PLAIN or (len(present) == 1 and _clean_numbers(values, present, finite)):
        return iter(()), node, depth, None        # the long flat runs big payloads are made of
    steps = item if keyed else range(len(item))
    if len(item) <= _SMALL:                       # a record: a loop costs less than setting up passes
        children = []
        for step, value in zip(steps, values):
            if type(value) in _PLAIN:
                continue
            if _is_container(value):
                children.append((step, value))
                continue
            problem = _scalar_problem(value, finite)
            if problem is not None:
                return iter(children), node, depth, (step, problem)
        return iter(children), node, depth, None
    return _open_long(item, keyed, values, present, node, depth, finite)


def _clean_numbers(values, present: set, finite: bool) -> bool:
    """True for a container of ints that fit in 64 bits, or of floats (finite where asked), alone."""
    if present == _INTS:
        return _INT_MIN <= min(values) and max(values) <= _INT_MAX
    if present == _FLOATS:
        return not finite or all(map(math.isfinite, values))
    return False


def _open_long(item, keyed: bool, values, present: set, node, depth: int, finite: bool) -> tuple:
    """_open for a long container of mixed values: each check a pass at C speed, a few bytes per value."""
    kinds = list(map(type, values))
    first, problem, nested = len(kinds), None, set()
    for kind in present - _PLAIN:             # a handful of kinds at most
        if _is_container_kind(kind):
            nested.add(kind)
            continue
        found = _first_bad_number(values, kinds, kind, finite) if kind in _NUMBERS else \
            (indexOf(kinds, kind), None)      # any other kind is a problem by its type alone
        if found is not None and found[0] < first:
            first = found[0]
            problem = found[1] or _scalar_problem(next(islice(values, first, None)), finite)
    keys, values = (list(item), list(values)) if keyed else (None, values)
    at = compress(count(), map(nested.__contains__, islice(kinds, first))) if nested else ()
    children = ((keys[i], values[i]) for i in at) if keyed else ((i, values[i]) for i in at)
    bad = None if problem is None else (keys[first] if keyed else first, problem)
    return children, node, depth, bad


def _first_bad_number(values, kinds: list, kind: type, finite: bool) -> tuple[int, str] | None:
    """(index, problem) of the first int past 64 bits or (finite) the first non-finite float."""
    mask = list(map(is_, kinds, repeat(kind)))
    numbers = list(compress(values, mask))
    if kind is int:
        if _INT_MIN <= min(numbers) and max(numbers) <= _INT_MAX:
            return None
        k = indexOf(map(or_, map(_INT_MAX.__lt__, numbers), map(_INT_MIN.__gt__, numbers)), True)
        problem = _INT_PROBLEM
    else:
        if not finite or all(map(math.isfinite, numbers)):
            return None
        k = indexOf(map(math.isfinite, numbers), False)
        problem = f"numbers must be finite, got {numbers[k]}"
    return next(islice(compress(count(), mask), k, None)), problem


def _problem(item: Any, depth: int, max_depth: int | None, finite: bool) -> str | None:
    if _is_container(item):
        return _container_problem(item, depth, max_depth)
    return _scalar_problem(item, finite)


def _is_container(item: Any) -> bool:
    return _is_container_kind(type(item))


def _is_container_kind(kind: type) -> bool:
    if kind is list or kind is dict:
        return True
    # ExtType is a namedtuple, so it must not pass for an array.
    return issubclass(kind, (dict, list, tuple)) and not issubclass(kind, ExtType)


def _container_problem(item: dict | list | tuple, depth: int, max_depth: int | None) -> str | None:
    if max_depth is not None and depth > max_depth:
        return f"nests deeper than {max_depth} levels"
    if isinstance(item, dict) and not _STR_ONLY.issuperset(map(type, item)):
        first = min(indexOf(map(type, item), kind) for kind in set(map(type, item)) - _STR_ONLY)
        return f"map keys must be strings, got {wire_type(next(islice(item, first, None)))}"
    return None


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
