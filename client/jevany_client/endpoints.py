"""Where the daemon listens by default, shared by the daemon and its clients.

Defaults are ipc sockets in a per-user runtime directory, never TCP: a default
socket must not be reachable from another user or from the network.
"""

import functools
import os
import socket
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
    for e in endpoints:
        check_endpoint(e)
    return endpoints


_FORMS = ("endpoints are ipc://PATH or tcp://HOST:PORT (dns+tcp://NAME:PORT for every address of a name)")
_HTTP_ADVICE = ("the daemon's HTTP gateway speaks HTTP (curl/POST /v1/systemone); "
                "ZeroMQ clients use tcp://HOST:PORT of --bind")


def check_endpoint(endpoint: str) -> None:
    """Refuse at once an endpoint a client cannot connect to, saying the form that was probably meant
    (ZeroMQ itself only says "Invalid argument" or "Protocol not supported")."""
    scheme, sep, rest = endpoint.partition("://")
    if sep and scheme in ("ipc", "inproc") and rest:
        return
    if sep and scheme == "dns+tcp":
        return      # discovery.parse checks the rest
    if sep and scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if colon and host and port.isdigit() and 0 < int(port) < 65536:
            if host != "*":
                return
            advice = f"* is for binding; connect to the daemon's host: tcp://HOST:{port}"
        else:
            advice = "write tcp://HOST:PORT, PORT being the port of the daemon's --bind"
    elif sep and scheme in ("http", "https"):
        advice = f"that is an HTTP URL: {_HTTP_ADVICE}"
    elif sep:
        advice = f"{scheme}:// is not one of them"
    elif endpoint.startswith(("/", "./", "~")) or endpoint.endswith(".sock"):
        advice = f"did you mean ipc://{endpoint}?"
    elif endpoint.rpartition(":")[2].isdigit() and endpoint.rpartition(":")[0]:
        advice = f"did you mean tcp://{endpoint}?"
    else:
        advice = "a socket file is ipc:///path/to/daemon.sock, a daemon on the network tcp://HOST:PORT"
    raise ValueError(f"cannot use the endpoint {endpoint!r}: {_FORMS}; {advice}")


PROBE_S = 2.0     # how long a probe waits for a TCP connection, then for the daemon's greeting


def tcp_problem(endpoint: str, within: float = PROBE_S) -> str | None:
    """Why no ZeroMQ daemon can answer at a tcp:// endpoint, found in at most about 2 x `within`
    seconds; None when one may (or the endpoint is not tcp://).

    A client's own socket waits for a daemon that is starting, in silence, for the whole timeout;
    a command line asks this first. A plain TCP connection is made: refused or unanswered, nothing
    listens; accepted, a ZeroMQ peer greets at once with the byte 0xFF (ZMTP's signature), where an
    HTTP server says nothing until asked."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    host = host.rpartition(";")[2].strip("[]")     # tcp://SOURCE;HOST:PORT connects from SOURCE
    where = f"{host}:{port}"
    check = f"is the daemon running, and is {port} its --bind?"
    try:
        conn = socket.create_connection((host, int(port)), timeout=within)
    except ConnectionRefusedError:
        return f"nothing listens at {where}: {check}"
    except socket.gaierror as exc:
        return f"cannot look up {host}: {exc.strerror or exc}"
    except TimeoutError:
        return f"nothing answered at {where} within {within:g}s (a host that is down, or a firewall): {check}"
    except OSError as exc:
        return f"cannot reach {where}: {exc.strerror or exc}: {check}"
    with conn:
        conn.settimeout(within)
        try:
            first = conn.recv(1)
        except TimeoutError:
            first = None
        except OSError:
            first = b""
    if first == b"\xff":
        return None
    if first is None:
        return (f"something listens at {where} but sent no ZeroMQ greeting within {within:g}s: "
                f"it looks like an HTTP port; {_HTTP_ADVICE}")
    how = "closed the connection" if first == b"" else "answered"
    return f"something listens at {where} but {how} without a ZeroMQ greeting: it is not a daemon's --bind"


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
