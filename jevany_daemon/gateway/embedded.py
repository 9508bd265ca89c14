"""The gateway's routes on a model in this process: what app.py's routes call, answered by a JevModel here.

JevAny's create_app(model=...) serves an already loaded model to HTTP and
Python callers at once; this is ours. The routes are the gateway's own (the
same validation, answers, errors and CORS); only the far end differs: no
daemon, the model's engine, whose group commit puts requests from every
caller's thread, HTTP's included, into shared passes.

An embedded app serves text only. Its files would be read by this process
unchecked, where the daemon checks media in a process of its own.
"""
import asyncio

from jevany_client.errors import InvalidRequestError, JevTimeoutError

from jevany_daemon.media.policy import MediaPolicy

from .replies import TIMEOUT_HEADER

TEXT_ONLY = ("media is disabled: an embedded app serves text only; serve media through "
             "jevany-daemon serve --media-root")


class InProcess:
    """Upstream's start, call and close, on a JevModel (or the way to load one during the ASGI start-up)."""

    def __init__(self, model=None, load=None):
        self.model, self._load = model, load

    def start(self) -> None:
        # As JevAny's create_app(checkpoint): the model loads while the app starts, before it serves.
        if self.model is None:
            self.model = self._load()

    async def close(self) -> None:
        """An injected model outlives its app, as in JevAny: nothing to release."""

    async def call(self, op: str, body: dict | None = None, timeout_ms: int | None = None,
                   wait_s: float = 30.0) -> dict:
        if op == "status":
            return {"state": "starting" if self.model is None else "ready"}
        if op == "models":
            return {"models": [description(self.model)]}
        if timeout_ms is not None:
            raise InvalidRequestError(f"{TIMEOUT_HEADER} bounds the wait in the daemon's queue; an embedded "
                                      "app has none, and scores every request it accepts")
        if body.get("media"):
            raise InvalidRequestError(TEXT_ONLY)
        try:
            # A thread each: the engine's group commit batches the callers blocked in it.
            return await asyncio.wait_for(asyncio.to_thread(self.model.decide_body, body), wait_s)
        except asyncio.TimeoutError:
            raise JevTimeoutError(f"no answer from the model within {wait_s:g}s") from None


def description(model) -> dict:
    """The models op's description of an in-process model, with the media policy (off) in its limits."""
    described = model.describe()
    media = MediaPolicy(None).limits(described.get("media_types") or ())
    return {**described, "limits": {**described["limits"], **media}}
