"""The CurveZMQ keys a client connects with: the daemon's public key and the client's own pair."""

import os
from pathlib import Path


def curve_keys(server, secret_file, public, secret) -> tuple[bytes, bytes, bytes] | None:
    """(server public, client public, client secret) as z85 bytes, or None for plain connections."""
    if server is None:
        if secret_file is not None or public is not None or secret is not None:
            raise ValueError(
                "client keys need server_public_key too (the daemon's .key file or z85 key)"
            )
        return None
    if _looks_like_key(server):
        server_key = _z85(server)
    else:
        server_key = _read_key(server, secret=False)[0]
    if secret_file is not None:
        if public is not None or secret is not None:
            raise ValueError(
                "give client_secret_key_file or client_public_key + client_secret_key, not both"
            )
        client_public, client_secret = _read_key(secret_file, secret=True)
    elif public is not None and secret is not None:
        client_public, client_secret = _z85(public), _z85(secret)
    else:
        raise ValueError(
            "server_public_key needs the client's own key pair: client_secret_key_file, "
            "or client_public_key and client_secret_key"
        )
    return server_key, client_public, client_secret


def _looks_like_key(value) -> bool:
    if not isinstance(value, (str, bytes)) or len(value) != 40:
        return False
    return not os.path.exists(os.fsdecode(value))


def _z85(value: str | bytes) -> bytes:
    from zmq.utils import z85

    try:
        key = value.encode("ascii") if isinstance(value, str) else bytes(value)
        if len(key) == 40 and len(z85.decode(key)) == 32:
            return key
    except (ValueError, TypeError, KeyError):     # KeyError: a character outside z85's alphabet
        pass
    raise ValueError("a CurveZMQ key is 40 characters of z85 text")


def _read_key(path: str | os.PathLike, secret: bool) -> tuple[bytes, bytes | None]:
    """Read a key file in ZeroMQ's certificate format (what `jevany-daemon keygen` writes)."""
    from zmq.auth import load_certificate   # only clients that use CURVE pay for the import

    try:
        public, secret_key = load_certificate(Path(path).expanduser())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the CurveZMQ key file {path}: {exc}") from None
    if secret and not secret_key:
        raise ValueError(f"{path} holds no secret key; give the .key_secret file")
    return _z85(public), (_z85(secret_key) if secret_key else None)
