"""Where the daemon is in its run, and how the run ends: the one place that changes either.

starting (workers loading) → ready (every serving worker loaded) → draining
(no new work; the queue and the workers empty) → drained (a drain op: idle,
answering status) or done (a signal or a failure: the loop ends). Beside the
state: whether the drain ends in exit, whether to stop without waiting for the
queue (a second signal, a failure), the first failure and the exit status, and
the control clients waiting to hear "drained". Everyone else reads these; only
the methods here change them.
"""
STARTING, READY, DRAINING, DRAINED = "starting", "ready", "draining", "drained"


class RunState:
    def __init__(self, started: float):
        self._started = started
        self._state = STARTING
        self._exiting = False              # drain ends in exit (signal) rather than idling (drain op)
        self._stop_now = False
        self._done = False
        self._failure: str | None = None
        self._exit_code = 0
        self._drain_waiters: list = []     # control clients awaiting "drained"

    # --- read --------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def started(self) -> float:
        """When the run began, by the supervisor's clock: uptime and the time to ready count from it."""
        return self._started

    @property
    def winding_down(self) -> bool:
        """Draining or drained: no new work is taken."""
        return self._state in (DRAINING, DRAINED)

    @property
    def stopping(self) -> bool:
        """Draining on the way out (a signal or a failure): nothing is restarted any more."""
        return self._state == DRAINING and self._exiting

    @property
    def stopping_now(self) -> bool:
        """Stopping without waiting for the queue: what waits is answered shutting_down."""
        return self._stop_now

    @property
    def done(self) -> bool:
        return self._done

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def exit_code(self) -> int:
        return self._exit_code

    # --- change ------------------------------------------------------------

    def ready(self) -> bool:
        """Every serving worker loaded; True only the first time, while starting."""
        if self._state != STARTING:
            return False
        self._state = READY
        return True

    def begin_drain(self, exiting: bool) -> None:
        """Take no new work; exiting: end the loop once drained (a drain op's drain may become one)."""
        self._state = DRAINING
        self._exiting = self._exiting or exiting

    def stop_now(self) -> None:
        self._stop_now = True

    def fail(self, message: str, exit_code: int = 1) -> str:
        """The exit status and the failure the stop event reports; the first failure is the one kept."""
        self._failure = self._failure or message
        self._exit_code = exit_code
        return self._failure

    def await_drain(self, waiter: tuple) -> None:
        """(socket, envelope, request id) of a control client to tell "drained"."""
        self._drain_waiters.append(waiter)

    def drained(self) -> list:
        """Nothing left: done if the drain ends in exit, else drained. Returns the clients to tell."""
        waiters, self._drain_waiters = self._drain_waiters, []
        if self._exiting:
            self._done = True
        else:
            self._state = DRAINED      # what status says from now on: nothing left, nothing taken
        return waiters
