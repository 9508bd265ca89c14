"""CurveZMQ for TCP endpoints: key files, and the ZAP handler that admits only listed clients.

Key files are ZeroMQ's certificate format (what zmq.auth reads and other
ZeroMQ tools write): PREFIX.key holds the public key, PREFIX.key_secret both.
The ZAP handler is a REP socket served from the supervisor's own loop, so no
thread is added; libzmq asks it about every CURVE handshake.
"""
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

import zmq
from zmq.auth import load_certificate
from zmq.utils import z85

from jevany_daemon.logs import RateLimited, event

log = logging.getLogger("jevany.curve")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"jevany"
DENIED_LOG_PERIOD_S = 60.0

_BANNER = "#   ZeroMQ CURVE {kind} certificate, written by jevany-daemon keygen on {when}\n"
_SECRET_WARNING = "#   Keep this file secret: whoever holds it can act as this peer.\n"


def write_keypair(prefix: str | os.PathLike) -> tuple[Path, Path]:
    """Write PREFIX.key (public, 0644) and PREFIX.key_secret (0600); never overwrite either."""
    public_key, secret_key = zmq.curve_keypair()
    public_path, secret_path = Path(f"{prefix}.key"), Path(f"{prefix}.key_secret")
    for path in (public_path, secret_path):
        if path.exists():
            raise FileExistsError(f"{path} exists; refusing to overwrite a key")
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    _write(secret_path, 0o600, _BANNER.format(kind="secret", when=when) + _SECRET_WARNING
           + _body(public_key, secret_key))
    _write(public_path, 0o644, _BANNER.format(kind="public", when=when) + _body(public_key, None))
    return public_path, secret_path


def _body(public_key: bytes, secret_key: bytes | None) -> str:
    lines = ["", "metadata", "curve", f'    public-key = "{public_key.decode()}"']
    if secret_key is not None:
        lines.append(f'    secret-key = "{secret_key.decode()}"')
    return "\n".join(lines) + "\n"


def _write(path: Path, mode: int, text: str) -> None:
    # O_EXCL with the final mode: the secret is never readable by others, not even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(text)


def load_server_keys(path: str | os.PathLike) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys from a .key_secret file; ValueError says what is wrong."""
    try:
        public_key, secret_key = load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the CURVE key {path}: {exc}") from None
    if not secret_key:
        raise ValueError(f"{path} holds no secret key; give the .key_secret file written by keygen")
    return public_key, secret_key


def load_allowed(directory: str | os.PathLike) -> set[bytes]:
    """The raw 32-byte public keys of every *.key file in directory."""
    allowed = set()
    for path in sorted(Path(directory).glob("*.key")):
        try:
            public_key, _ = load_certificate(path)
            allowed.add(z85.decode(public_key))
        except (OSError, ValueError) as exc:
            event(log, "curve_key_skipped", level=logging.WARNING, path=path, error=exc)
    return allowed


def secure(sock, public_key: bytes, secret_key: bytes) -> None:
    """Make a ROUTER a CURVE server whose handshakes the ZAP handler decides."""
    sock.curve_server = True
    sock.curve_publickey = public_key
    sock.curve_secretkey = secret_key
    sock.zap_domain = ZAP_DOMAIN


class ZapHandler:
    """Answers libzmq's ZAP requests: 200 for an allowed client key, 400 for anything else."""

    def __init__(self, ctx, allowed_dir: str, clock):
        self.allowed_dir = allowed_dir
        self.allowed = load_allowed(allowed_dir)
        self.sock = ctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)     # before any CURVE socket binds, or libzmq admits everyone
        self.denied = RateLimited(log, "curve_denied", DENIED_LOG_PERIOD_S, clock, level=logging.WARNING)
        event(log, "curve", allowed_clients=len(self.allowed), directory=allowed_dir)

    def reload(self) -> None:
        self.allowed = load_allowed(self.allowed_dir)
        event(log, "curve_reload", allowed_clients=len(self.allowed))

    def handle(self) -> None:
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.sock.send_multipart(self.answer(frames))

    def answer(self, frames: list[bytes]) -> list[bytes]:
        version, request_id, _domain, address, _identity, mechanism, *credentials = frames
        if mechanism == b"CURVE" and credentials and credentials[0] in self.allowed:
            return [version, request_id, b"200", b"OK", z85.encode(credentials[0]), b""]
        self.denied.hit(address=address.decode(errors="replace"), mechanism=mechanism.decode(errors="replace"))
        return [version, request_id, b"400", b"client key not allowed", b"", b""]

    def close(self) -> None:
        self.sock.close()
