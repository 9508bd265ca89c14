"""JevAny's text rendering of request values, byte for byte."""

from typing import Any

from .errors import InvalidRequestError
from .protocol import MAX_DEPTH
from .schema import Question

# Validated values nest at most MAX_DEPTH levels, one indent per level; the
# margin lets callers start at a small indent. Past it the value skipped
# validation, and recursing further could exhaust the stack.
_MAX_INDENT = 2 * MAX_DEPTH


def render(value: Any, indent: int = 0) -> str:
    if indent > _MAX_INDENT:
        raise InvalidRequestError(f"value nests deeper than {MAX_DEPTH} levels")
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return "\n".join(_render_item(item, indent) for item in value)
    if isinstance(value, dict):
        return "\n".join(_render_entry(key, item, indent) for key, item in value.items())
    return str(value)


def _render_item(item: Any, indent: int) -> str:
    return f"{'  ' * indent}- {render(item, indent + 1).lstrip()}"


def _render_entry(key: str, item: Any, indent: int) -> str:
    pad = "  " * indent
    if isinstance(item, (dict, list, tuple)):
        # An empty container still gets its own (empty) line, as in JevAny.
        return f"{pad}{key}:\n{render(item, indent + 1)}"
    return f"{pad}{key}: {render(item)}"


def _option(name: str, description: Any) -> str:
    if description is None or description == "":
        return name
    return f"{name}: {render(description)}"


def native_options(q: Question) -> list[str]:
    if q.type == "choice":
        return [_option(name, description) for name, description in q.criteria.items()]
    if q.type == "noul":
        criteria = q.criteria or {}
        return [_option("no", criteria.get("false")), _option("yes", criteria.get("true"))]
    return [render(level) for level in q.criteria]
