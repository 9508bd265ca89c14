"""Where the daemon is in its run, and how the run ends (no daemon)."""
from jevany_daemon.server.run_state import RunState


def test_ready_comes_once_and_only_while_starting():
    run = RunState(started=1.0)
    assert run.state == "starting" and not run.winding_down
    assert run.ready() is True and run.state == "ready"
    assert run.ready() is False
    run.begin_drain(exiting=False)
    assert run.ready() is False and run.state == "draining"


def test_a_drain_op_winds_down_without_stopping_and_ends_drained_taking_no_work():
    run = RunState(started=0.0)
    run.ready()
    run.begin_drain(exiting=False)
    assert run.winding_down and not run.stopping
    run.await_drain(("sock", [b"id"], 7))
    assert run.drained() == [("sock", [b"id"], 7)]
    assert run.state == "drained" and run.winding_down and not run.done and not run.stopping


def test_a_signal_drain_is_stopping_and_ends_done():
    run = RunState(started=0.0)
    run.ready()
    run.begin_drain(exiting=True)
    assert run.stopping and not run.done
    run.drained()
    assert run.done


def test_each_drain_waiter_is_told_once():
    run = RunState(started=0.0)
    run.begin_drain(exiting=False)
    run.await_drain(("a", [], 1))
    assert run.drained() == [("a", [], 1)]
    assert run.drained() == []


def test_the_first_failure_is_the_one_kept_and_the_last_exit_code_counts():
    run = RunState(started=0.0)
    assert run.fail("worker failed to load", exit_code=3) == "worker failed to load"
    assert run.fail("a second problem") == "worker failed to load"
    assert (run.failure, run.exit_code) == ("worker failed to load", 1)
