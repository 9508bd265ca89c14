"""The client-facing ROUTER sockets: bind safely, secure TCP with CURVE, open ipc files to a group."""
import os
import socket
import stat
from pathlib import Path

import zmq

from jevany_client.endpoints import ipc_path
from jevany_client.ipc_trust import ipc_problem

from . import curve

REPLY_LINGER_MS = 2000    # on close, how long final replies may take to leave
HANDSHAKE_MS = 10_000     # a connection that has not finished its ZMTP handshake by then is dropped


class StartupError(RuntimeError):
    """The daemon cannot start (socket in use, model failed to load); the message says why."""


def bind_router(ctx, endpoint: str, max_message_bytes: int, curve_keys: tuple | None = None,
                mode: int | None = None, flag: str = "--bind") -> tuple[zmq.Socket, "Listener"]:
    """A ROUTER bound to endpoint, and its Listener (which can stop and resume taking peers).

    flag names the setting the endpoint came from, for the error that says how to fix a clash.
    """
    path = ipc_path(endpoint)
    if path is not None:
        prepare_ipc_path(path, endpoint, flag)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, REPLY_LINGER_MS)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
    # Without this a ROUTER drops a reply silently when the client's pipe is full
    # or the client is gone; with it the send fails and the drop can be counted.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if curve_keys is not None and endpoint.startswith("tcp://"):
        curve.secure(sock, *curve_keys)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close()
        said = zmq.strerror(exc.errno)     # str(exc) repeats the address
        raise StartupError(f"cannot bind {endpoint} ({flag}): {said}{_advice(endpoint, flag, exc.errno)}") from None
    listener = Listener(sock, sock.getsockopt_string(zmq.LAST_ENDPOINT), path, mode)
    listener.set_mode()
    return sock, listener


_LOOPBACK = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "[::1]"}


def _advice(endpoint: str, flag: str, errno: int) -> str:
    """What to do about a TCP port something else holds: as --http's refusal says it (gateway_handle.py)."""
    if errno != zmq.EADDRINUSE or not endpoint.startswith("tcp://"):
        return ""
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    host = _LOOPBACK.get(host, host)      # a wildcard is bound, not connected to
    return (f"; another process listens on port {port}: choose another port for {flag}, or stop what holds it "
            f"(another daemon answers `jevany-ctl status --endpoint tcp://{host}:{port}`; "
            f"`ss -ltnp 'sport = :{port}'` names the process)")


class Listener:
    """One bound endpoint, which can stop taking new peers while descriptors run short, and resume.

    Unbinding would not do: libzmq closes every connection an endpoint
    accepted when it is unbound. An ipc socket file is made mode 0 instead,
    so the kernel refuses new connections before libzmq sees them (root
    excepted); TCP connections, and root's, are closed as they are accepted
    (peers.py). Its ipc file is removed at exit only while it is still ours.
    """

    def __init__(self, sock, endpoint: str, path: Path | None, mode: int | None):
        self.sock, self.endpoint, self.path, self.mode = sock, endpoint, path, mode
        self.taking = True
        self.inode = None

    def set_mode(self) -> None:
        if self.path is None:
            return
        if self.mode is not None:
            self.path.chmod(self.mode)     # e.g. 0660 with a shared group: that group's members may connect
        st = os.lstat(self.path)
        self.inode, self.mode = st.st_ino, stat.S_IMODE(st.st_mode)

    def stop(self) -> None:
        if self.taking and self.path is not None:
            self._chmod(0)
        self.taking = False

    def resume(self) -> None:
        if not self.taking and self.path is not None:
            self._chmod(self.mode)
        self.taking = True

    def _chmod(self, mode: int) -> None:
        try:
            if os.lstat(self.path).st_ino == self.inode:
                os.chmod(self.path, mode)
        except OSError:
            pass

    def remove_file(self) -> None:
        """At exit: unlink the socket file, unless something else was put there since."""
        if self.path is None or self.inode is None:
            return
        try:
            if os.lstat(self.path).st_ino == self.inode:
                self.path.unlink()
        except OSError:
            pass     # gone already, or a directory we may no longer write: nothing of ours to clean


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
