"""Where the daemon listens by default, shared by the daemon and its clients.

Defaults are ipc sockets in a per-user runtime directory, never TCP: a default
socket must not be reachable from another user or from the network.
"""

import functools
import os
from pathlib import Path

from .ipc_trust import socket_file_problem

ENDPOINT_ENV = "JEVANY_ENDPOINT"
CONTROL_ENDPOINT_ENV = "JEVANY_CONTROL_ENDPOINT"
_IPC = "ipc://"


def runtime_dir() -> Path:
    """$XDG_RUNTIME_DIR when it names a directory, else /tmp/jevany-UID."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg)
    return Path(f"/tmp/jevany-{os.getuid()}")


def default_endpoint() -> str:
    return os.environ.get(ENDPOINT_ENV) or f"{_IPC}{runtime_dir()}/jevany/daemon.sock"


def default_control_endpoint() -> str:
    return os.environ.get(CONTROL_ENDPOINT_ENV) or f"{_IPC}{runtime_dir()}/jevany/control.sock"


def ipc_path(endpoint: str) -> Path | None:
    """The socket file behind an ipc:// endpoint; None for other transports.

    Linux abstract sockets (ipc://@name) have no file, so they give None too.
    """
    if not endpoint.startswith(_IPC):
        return None
    path = endpoint[len(_IPC) :]
    if not path or path.startswith("@"):
        return None
    return Path(path)


@functools.lru_cache(maxsize=256)
def _socket_file(endpoint: str) -> str | None:
    """ipc_path as a plain string, kept per endpoint: a client asks before every call."""
    path = ipc_path(endpoint)
    return None if path is None else str(path)


def endpoint_list(endpoint: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """A client's endpoints: the one given, each of a list, or the default one."""
    if endpoint is None:
        return [default_endpoint()]
    endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
    if not endpoints or not all(isinstance(e, str) and e for e in endpoints):
        raise ValueError(f"endpoint must be a non-empty str or list of them, got {endpoint!r}")
    return endpoints


def missing_sockets(endpoints: list[str]) -> str | None:
    """Why no daemon can answer: an ipc socket another user could have put there (nothing is sent
    to it), or every endpoint an ipc socket file that does not exist. Asked before every call."""
    paths = [_socket_file(e) for e in endpoints]
    for endpoint, path in zip(endpoints, paths):
        problem = None if path is None else socket_file_problem(path)
        if problem is not None:
            return f"refusing to use {endpoint}: {problem}"
    if not paths or any(p is None or os.path.exists(p) for p in paths):
        return None
    where = ", ".join(str(p) for p in paths)
    return (f"no daemon at {where}: no socket file there (is the daemon running, and bound there? "
            f"the default endpoint is {default_endpoint()})")
