"""What a model source names: a local directory, or a Hugging Face hub id with an optional revision.

No torch: the supervisor checks --model with it before any worker starts.
"""
import re
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")


def split_revision(source: str) -> tuple[str, str | None]:
    """'owner/name@rev' -> ('owner/name', 'rev'); anything without '@' has no revision."""
    name, sep, rev = source.partition("@")
    return (name, rev) if sep and rev else (source, None)


def is_hub_id(source: str) -> bool:
    return bool(_HUB_ID.match(source)) and not Path(source).expanduser().exists()


def local_problem(source: str) -> str | None:
    """Why source can name nothing, without loading anything; None when it may be loadable."""
    path = Path(source).expanduser()
    if path.exists():
        return None if path.is_dir() else f"model source is not a directory: {source}"
    return None if is_hub_id(source) else f"model does not exist: {source}"
