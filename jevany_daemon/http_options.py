"""The HTTP settings' vocabulary, shared by the supervisor (which validates the settings) and the
gateway (which applies them): the dialects one may choose, and how the CORS origins are written."""
import re

# Where JevAny's HTTP API and TypeSafe's Jev API differ, whose choice the gateway makes (gateway/dialects.py).
DIALECTS = ("jevany", "typesafe")

_ORIGIN = re.compile(r"https?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?")


def cors_origins(value: str) -> list[str]:
    """http_cors_origins as the origins a browser page may call from: ["*"] (any, JevAny's), a list, or []."""
    origins = [o.strip() for o in value.split(",") if o.strip()] if isinstance(value, str) else None
    if origins is None or (origins != ["*"] and not all(_ORIGIN.fullmatch(o) for o in origins)):
        raise ValueError(f"http_cors_origins must be *, empty (none), or origins such as "
                         f"https://app.example:8443 separated by commas, got {value!r}")
    return origins
