"""The client-facing ROUTER sockets: bind safely, secure TCP with CURVE, open ipc files to a group."""
import socket
from pathlib import Path

import zmq

from jevany_client.endpoints import ipc_path
from jevany_client.ipc_trust import ipc_problem

from . import curve

REPLY_LINGER_MS = 2000    # on close, how long final replies may take to leave


class StartupError(RuntimeError):
    """The daemon cannot start (socket in use, model failed to load); the message says why."""


def bind_router(ctx, endpoint: str, max_message_bytes: int, curve_keys: tuple | None = None,
                mode: int | None = None, flag: str = "--bind") -> tuple[zmq.Socket, Path | None]:
    """A ROUTER bound to endpoint; for ipc also the socket file, chmod'ed to mode when given.

    flag names the setting the endpoint came from, for the error that says how to fix a clash.
    """
    path = ipc_path(endpoint)
    if path is not None:
        prepare_ipc_path(path, endpoint, flag)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, REPLY_LINGER_MS)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    # Without this a ROUTER drops a reply silently when the client's pipe is full
    # or the client is gone; with it the send fails and the drop can be counted.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if curve_keys is not None and endpoint.startswith("tcp://"):
        curve.secure(sock, *curve_keys)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close()
        raise StartupError(f"cannot bind {endpoint} ({flag}): {exc}") from None
    if path is not None and mode is not None:
        path.chmod(mode)     # e.g. 0660 with a shared group: that group's members may connect
    return sock, path


def prepare_ipc_path(path: Path, endpoint: str, flag: str = "--bind") -> None:
    """Make the socket's directory (0700) if need be, refuse one another user could swap, and refuse
    to replace a socket something still answers on (libzmq would silently steal a running daemon's
    clients)."""
    problem = ipc_problem(path)
    if problem is None:
        problem = _make_directories(path.parent)
    if problem is None:
        problem = ipc_problem(path)      # what was just made, and what may have raced in
    if problem is not None:
        raise StartupError(f"refusing to serve on {endpoint} ({flag}): {problem}")
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            raise StartupError(f"another process is serving on {endpoint}; stop it or choose another {flag}")
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)   # stale file from a daemon that died
        finally:
            probe.close()


def _make_directories(directory: Path) -> str | None:
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for made in reversed(missing):
        try:
            made.mkdir(mode=0o700)
        except FileExistsError:
            pass            # raced in: checked again by the caller
        except OSError as exc:
            return f"cannot create {made} ({exc.strerror})"
    return None
