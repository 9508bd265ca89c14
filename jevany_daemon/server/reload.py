"""Reload: load the next generation of workers beside the serving one, switch, retire the old.

Nothing fails because of a reload: the serving workers take requests until
every new worker is ready; then the new generation takes the queue and the
old workers finish what they hold before they are told to stop. A reload
whose workers cannot load is abandoned and the old generation keeps serving.
The settings are read again (so --config can name a new model); what only a
restart can change (sockets, queue, keys) is kept and listed in the reply.
"""
import logging
import time
from dataclasses import dataclass, field

from jevany_client.errors import InternalError, JevanyError, ShuttingDownError
from jevany_client.protocol import error_reply, ok_reply

from .logs import event
from .run_state import READY
from .settings import ServeSettings, SettingsError

log = logging.getLogger("jevany.reload")


@dataclass(eq=False)
class Reload:
    generation: int
    settings: ServeSettings
    cause: str
    started: float
    needs_restart: list[str]
    waiters: list = field(default_factory=list)     # (sock, envelope, request id) of control clients


class Reloads:
    def __init__(self, sup, fresh_settings):
        self.sup = sup
        self.fresh_settings = fresh_settings     # () -> ServeSettings, read again on every reload
        self.current: Reload | None = None
        self.last: dict | None = None

    def begin(self, cause: str, waiter=None) -> None:
        if self.current is not None:     # one at a time; a second asker hears how the running one ends
            self.current.waiters += [waiter] if waiter else []
            return
        sup = self.sup
        state = sup.run_state.state
        if state != READY:
            stopping = sup.run_state.winding_down
            why = f"the daemon is {state}" if stopping else "the daemon is still starting"
            err_cls = ShuttingDownError if stopping else InternalError
            return self._refuse(waiter, cause, err_cls(f"reload refused: {why}"))
        try:
            settings, needs_restart = sup.settings.with_reloaded(self.fresh_settings())
        except SettingsError as exc:
            return self._refuse(waiter, cause, InternalError(f"reload refused: {exc}"))
        if sup.zap is not None:
            sup.zap.reload()             # new client keys apply at once, to new connections
        generation = sup.pool.start_generation(settings)
        self.current = Reload(generation, settings, cause, sup.clock(), needs_restart, [waiter] if waiter else [])
        sup.notifier.reloading(time.monotonic_ns() // 1000)
        event(log, "reload", cause=cause, generation=generation, model=settings.model or "tiny-demo",
              workers=settings.worker_count, **({"needs_restart": ",".join(needs_restart)} if needs_restart else {}))

    def advance(self) -> None:
        """Switch once every new worker is ready."""
        r, sup = self.current, self.sup
        if r is None:
            return
        incoming = [w for w in sup.pool.workers if w.generation == r.generation]
        if len(incoming) < r.settings.worker_count or not all(w.ready_once for w in incoming):
            return
        sup.pool.switch_to(r.generation)
        sup.settings = r.settings
        model = incoming[0].model
        self.current = None
        self.last = {"reloaded": True, "model": model["id"], "generation": r.generation,
                     "workers": len(incoming), "seconds": round(sup.clock() - r.started, 3),
                     "needs_restart": r.needs_restart}
        sup.metrics.describe_model(sup.model_description())
        sup.metrics.reloads.labels("ok").inc()
        sup.notifier.ready(sup.status_line())
        event(log, "reload_done", generation=r.generation, model=model["id"], seconds=self.last["seconds"],
              retiring=len(sup.pool.retiring()))
        self._answer(r.waiters, self.last)

    def worker_failed(self, worker, cause: str) -> None:
        """A worker of the incoming generation died before it was ready: abandon this reload."""
        if self.current is not None and worker.generation == self.current.generation:
            self._abandon(worker.failure or f"a new worker exited before it was ready ({cause})")

    def cancel(self, why: str) -> None:
        if self.current is not None:
            self._abandon(why, ShuttingDownError)

    def describe(self) -> dict:
        return {"in_progress": self.current is not None, "serving_generation": self.sup.pool.serving_generation,
                "last": self.last}

    def _abandon(self, message: str, err_cls=InternalError) -> None:
        r, sup = self.current, self.sup
        self.current = None
        sup.pool.discard([w for w in sup.pool.workers if w.generation == r.generation], "reload abandoned")
        serving = sup.model_description()["id"]
        self.last = {"reloaded": False, "error": message, "generation": r.generation}
        sup.metrics.reloads.labels("failed").inc()
        sup.notifier.ready(sup.status_line())      # ends systemd's "reloading" state
        event(log, "reload_failed", level=logging.ERROR, generation=r.generation, error=message, serving=serving)
        err = err_cls(f"reload failed: {message}; still serving {serving}")
        for waiter in r.waiters:
            self._send_error(waiter, err)

    def _refuse(self, waiter, cause: str, err: JevanyError) -> None:
        event(log, "reload_refused", level=logging.WARNING, cause=cause, error=err.message)
        self.sup.metrics.reloads.labels("refused").inc()
        if waiter is not None:
            self._send_error(waiter, err)

    def _answer(self, waiters: list, result: dict) -> None:
        for sock, envelope, rid in waiters:
            self.sup.replies.record("reload", None)
            self.sup.replies.send(sock, envelope, ok_reply(rid, result))

    def _send_error(self, waiter, err: JevanyError) -> None:
        sock, envelope, rid = waiter
        self.sup.replies.record("reload", err.code)
        self.sup.replies.send(sock, envelope, error_reply(rid, err))
