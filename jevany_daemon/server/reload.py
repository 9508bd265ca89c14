"""Reload: load the next generation of workers beside the serving one, switch, retire the old.

Nothing fails because of a reload: the serving workers take requests until
every new worker is ready; then the new generation takes the queue and the
old workers finish what they hold before they are told to stop. A reload
whose workers cannot load is abandoned and the old generation keeps serving.
The settings are read again (so --config can name a new model); what only a
restart can change (sockets, queue, keys) is kept and listed in the reply.
The new settings take effect when the switch is made: advance() returns them
to the supervisor, which serves with them from then on.
"""
import logging
import time
from dataclasses import dataclass, field

from jevany_client.errors import InternalError, JevanyError, ShuttingDownError
from jevany_client.protocol import error_reply, ok_reply

from jevany_daemon.logs import event

from .run_state import READY
from .settings import ServeSettings, SettingsError
from .status import describe_model

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
    def __init__(self, *, fresh_settings, settings, run_state, pool, zap, clock, notifier, metrics, replies,
                 status_line):
        self.fresh_settings = fresh_settings     # () -> ServeSettings, read again on every reload
        self.settings = settings                 # () -> the serving settings; advance() returns the next
        self.run_state, self.pool, self.zap, self.clock = run_state, pool, zap, clock
        self.notifier, self.metrics, self.replies = notifier, metrics, replies
        self.status_line = status_line           # () -> systemd's STATUS= line
        self.current: Reload | None = None
        self.last: dict | None = None

    def begin(self, cause: str, waiter=None, same_settings: bool = False) -> None:
        """Start a reload; same_settings: replace the workers with the settings they serve with, not the
        ones read again (a replacement the daemon decided on must not apply a half-edited config)."""
        if self.current is not None:     # one at a time; a second asker hears how the running one ends
            self.current.waiters += [waiter] if waiter else []
            return
        state = self.run_state.state
        if state != READY:
            stopping = self.run_state.winding_down
            why = f"the daemon is {state}" if stopping else "the daemon is still starting"
            err_cls = ShuttingDownError if stopping else InternalError
            return self._refuse(waiter, cause, err_cls(f"reload refused: {why}"))
        try:
            settings, needs_restart = ((self.settings(), []) if same_settings
                                       else self.settings().with_reloaded(self.fresh_settings()))
        except SettingsError as exc:
            return self._refuse(waiter, cause, InternalError(f"reload refused: {exc}"))
        if self.zap is not None:
            self.zap.reload()            # new client keys apply at once, to new connections
        generation = self.pool.start_generation(settings)
        self.current = Reload(generation, settings, cause, self.clock(), needs_restart, [waiter] if waiter else [])
        self.notifier.reloading(time.monotonic_ns() // 1000)
        event(log, "reload", cause=cause, generation=generation, model=settings.model or "tiny-demo",
              workers=settings.worker_count, **({"needs_restart": ",".join(needs_restart)} if needs_restart else {}))

    def advance(self) -> ServeSettings | None:
        """Switch once every new worker is ready; returns the settings the daemon serves with from now on."""
        r = self.current
        if r is None:
            return None
        incoming = [w for w in self.pool.workers if w.generation == r.generation]
        if len(incoming) < r.settings.worker_count or not all(w.ready_once for w in incoming):
            return None
        self.pool.switch_to(r.generation)
        model = incoming[0].model
        self.current = None
        self.last = {"reloaded": True, "model": model["id"], "generation": r.generation,
                     "workers": len(incoming), "seconds": round(self.clock() - r.started, 3),
                     "needs_restart": r.needs_restart}
        self.metrics.describe_model(describe_model(self.pool, r.settings))
        self.metrics.reloads.labels("ok").inc()
        self.notifier.ready(self.status_line())
        event(log, "reload_done", generation=r.generation, model=model["id"], seconds=self.last["seconds"],
              retiring=len(self.pool.retiring()))
        self._answer(r.waiters, self.last)
        return r.settings

    def worker_failed(self, worker, cause: str) -> None:
        """A worker of the incoming generation died before it was ready: abandon this reload."""
        if self.current is not None and worker.generation == self.current.generation:
            self._abandon(worker.failure or f"a new worker exited before it was ready ({cause})")

    def cancel(self, why: str) -> None:
        if self.current is not None:
            self._abandon(why, ShuttingDownError)

    def describe(self) -> dict:
        return {"in_progress": self.current is not None, "serving_generation": self.pool.serving_generation,
                "last": self.last}

    def _abandon(self, message: str, err_cls=InternalError) -> None:
        r = self.current
        self.current = None
        self.pool.discard([w for w in self.pool.workers if w.generation == r.generation], "reload abandoned")
        serving = describe_model(self.pool, self.settings())["id"]
        self.last = {"reloaded": False, "error": message, "generation": r.generation}
        self.metrics.reloads.labels("failed").inc()
        self.notifier.ready(self.status_line())      # ends systemd's "reloading" state
        event(log, "reload_failed", level=logging.ERROR, generation=r.generation, error=message, serving=serving)
        err = err_cls(f"reload failed: {message}; still serving {serving}")
        for waiter in r.waiters:
            self._send_error(waiter, err)

    def _refuse(self, waiter, cause: str, err: JevanyError) -> None:
        event(log, "reload_refused", level=logging.WARNING, cause=cause, error=err.message)
        self.metrics.reloads.labels("refused").inc()
        if waiter is not None:
            self._send_error(waiter, err)

    def _answer(self, waiters: list, result: dict) -> None:
        for sock, envelope, rid in waiters:
            self.replies.record("reload", None)
            self.replies.send(sock, envelope, ok_reply(rid, result))

    def _send_error(self, waiter, err: JevanyError) -> None:
        sock, envelope, rid = waiter
        self.replies.record("reload", err.code)
        self.replies.send(sock, envelope, error_reply(rid, err))
