"""Signals acted on by the supervisor's handle-signals phase (supervisor.py, run_state.py), after a drain op:
a SIGTERM turns the drain into an exit, and a second signal stops without waiting for the queue.
No processes: the Supervisor with its signal flags and the parts a drain reaches stood in for."""
import signal
from types import SimpleNamespace

from jevany_daemon.server.supervisor import Supervisor


def supervisor(pending: list) -> Supervisor:
    settings = SimpleNamespace(max_queue=10, engine=SimpleNamespace(max_batch_size=4))
    sup = Supervisor(settings, clock=lambda: 5.0, env={})
    sup.wiring = SimpleNamespace(signals=SimpleNamespace(take=lambda: [pending.pop(0)] if pending else []),
                                 pool=SimpleNamespace(inflight=lambda: 0))
    sup.reloads = SimpleNamespace(cancel=lambda why: None)
    return sup


def test_a_sigterm_after_a_drain_op_turns_the_drain_into_an_exit_and_a_second_stops_at_once():
    pending = []
    sup = supervisor(pending)
    sup.begin_drain(exiting=False, cause="drain op")            # the drain op: drain, then idle
    assert sup.run_state.winding_down and not sup.run_state.stopping
    pending.append(signal.SIGTERM)
    sup.handle_signals()
    assert sup.run_state.stopping and not sup.run_state.stopping_now     # exits once drained, waits for it
    pending.append(signal.SIGINT)
    sup.handle_signals()
    assert sup.run_state.stopping_now                            # a second signal: no waiting for the queue


def test_a_drain_op_after_a_sigterm_does_not_cancel_the_exit():
    pending = [signal.SIGTERM]
    sup = supervisor(pending)
    sup.handle_signals()
    sup.begin_drain(exiting=False, cause="drain op")
    assert sup.run_state.stopping and not sup.run_state.stopping_now
