"""JevAny's HTTP API on a model in this process, as an ASGI app: JevAny's create_app and `jevany.serve:app`.

A JevAny user's embedding code changes its import line and nothing else:

    from jevany_daemon.asgi import JevModel, create_app    # JevAny: from jevany import ...; jevany.serve
    model = JevModel.from_pretrained("runs/rlcr")
    app = create_app(model=model)        # HTTP callers and model(request) share the model and its passes

    uvicorn jevany_daemon.asgi:app       # serves the model JEVANY_MODEL names (the JEVANY_* settings)

The routes are the daemon's gateway's (gateway/app.py) on an in-process
backend (gateway/embedded.py): the same answers, errors, CORS and OpenAPI
description. What the daemon adds (a queue shared with ZeroMQ clients, worker
processes, media checks, metrics) needs `jevany-daemon serve --http`.
"""
import os
from pathlib import Path

from fastapi import FastAPI

from .gateway.app import Gateway, create_app as _routes
from .http_options import DIALECTS
from .gateway.embedded import InProcess
from .inprocess import JevModel
from .server.settings import ServeSettings

__all__ = ["JevModel", "create_app"]


def create_app(checkpoint: str | Path | None = None, *, model: JevModel | None = None, token: str | None = None,
               cors_origins: str = "*", max_message_bytes: int = ServeSettings.max_message_bytes,
               dialect: str = ServeSettings.http_dialect, **options) -> FastAPI:
    """JevAny's create_app: serve `model`, already loaded (Python callers keep calling it), or load
    `checkpoint` with JevModel.from_pretrained's options while the app starts; with neither, the
    model the JEVANY_* settings name. token: a bearer token the routes then want (none: open, as JevAny).
    max_message_bytes: the largest request body, refused (413) before it is read past that (the app the
    JEVANY_* settings name takes JEVANY_MAX_MESSAGE_BYTES instead). dialect: where JevAny's API and
    TypeSafe's Jev API differ, whose choice ("jevany" or "typesafe", gateway/dialects.py)."""
    if model is not None and (checkpoint is not None or options):
        raise ValueError("pass either a loaded model or checkpoint loading options")
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}")
    settings = {"http_cors_origins": cors_origins, "max_message_bytes": max_message_bytes, "http_dialect": dialect}
    if model is not None:
        backend = InProcess(model)
    elif checkpoint is not None:
        backend = InProcess(load=lambda: JevModel.from_pretrained(checkpoint, **options))
    else:
        return _from_environment(**options)
    return _routes(Gateway(backend, settings, token, metrics_url=None))


def _from_environment(**refused) -> FastAPI:
    """What `uvicorn jevany_daemon.asgi:app` serves: the model, device, readout, limits and load options the
    JEVANY_* variables set, checked now; the model loads when the app starts."""
    from .server.settings import SettingsError, resolve

    if refused:
        raise TypeError(f"loading options {sorted(refused)} need a checkpoint")
    try:
        s = resolve({}, None, env=os.environ)
    except SettingsError as exc:
        raise SystemExit(f"error: {exc}") from None
    if s.model is None:
        raise SystemExit("error: JEVANY_MODEL: name the model this app serves (a directory, run or hub id)")
    if s.media_root is not None:
        raise SystemExit("error: JEVANY_MEDIA_ROOT: an embedded app serves text only; serve media through "
                         "jevany-daemon serve --media-root")
    token = Path(s.http_token_file).read_text(encoding="utf-8").strip() if s.http_token_file else None
    backend = InProcess(load=lambda: JevModel.from_settings(s))
    settings = {"http_cors_origins": s.http_cors_origins, "max_message_bytes": s.max_message_bytes,
                "http_dialect": s.http_dialect}
    return _routes(Gateway(backend, settings, token, metrics_url=None))


def __getattr__(name: str):
    # `app` is built on first use, so importing create_app reads no settings and loads nothing.
    if name == "app":
        globals()["app"] = app = _from_environment()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
