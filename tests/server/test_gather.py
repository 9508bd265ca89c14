"""GPU-aware group commit (server/gather.py): wait for answered clients only where passes cost the same
at any size, only for as long as the measurements justify, and never for a lone client."""
import pytest

from types import SimpleNamespace

from jevany_daemon.server.request_queue import Entry
from jevany_daemon.server.gather import (FIXED_SHARE, MAX_WAIT_S, RETURN_SAMPLES, SMOOTHING, Gather, PassCost,
                                         size_class)
from jevany_daemon.server.pace import Pace
from jevany_daemon.server.worker_events import WorkerEvents


def records(cost_ms_by_size: dict[int, float], times: int = 5) -> list:
    return [[size, 0, 0, ms, True, []] for _ in range(times) for size, ms in cost_ms_by_size.items()]


def flat(gather: Gather, ms: float = 80.0) -> Gather:
    gather.passes(records({1: ms, 8: ms + 1, 32: ms + 2}))   # a small model on a GPU: size barely matters
    return gather


def returning(gather: Gather, gap_s: float = 0.0005) -> Gather:
    """Clients that asked again gap_s after their answer, as closed-loop clients do."""
    for i in range(8):
        gather.answered(("c", i), 1.0)
        gather.arrived(("c", i), 1.0 + gap_s)
    return gather


def came_back(gather: Gather, clients, at: float = 0.5) -> Gather:
    """These clients asked again soon after an answer before: closed-loop clients, worth waiting for."""
    for client in clients:
        gather.answered(client, at)
        gather.arrived(client, at + 0.0005)
    return gather


def test_the_fixed_cost_of_a_pass_is_what_a_flat_cost_shows_and_a_linear_one_hides():
    g = PassCost()
    for size, ms in {1: 40.0, 8: 41.0, 32: 42.0}.items():
        g.record(size, ms / 1000)
    assert 0.039 < g.fixed_s() < 0.041
    cpu = PassCost()
    for size, ms in {1: 2.0, 8: 16.0, 32: 64.0}.items():     # a CPU: cost follows tokens
        cpu.record(size, ms / 1000)
    assert cpu.fixed_s() < 0.0005
    one = PassCost()
    one.record(32, 0.05)
    assert one.fixed_s() == 0.0                              # one size class says nothing about the fit


def test_a_lone_client_is_never_waited_for():
    g = returning(flat(Gather()))
    assert g.wait_s() == MAX_WAIT_S
    g.answered("lone", 10.0)
    g.arrived("lone", 10.2)                                  # it came back: its request is the one queued
    assert g.hold_until(queued=1, full=32, now=10.2) is None


def test_a_free_worker_waits_for_the_clients_just_answered_then_takes_the_queue():
    g = came_back(returning(flat(Gather())), range(32))
    for i in range(32):
        g.answered(i, 5.0)
    for i in range(20):
        g.arrived(i, 5.0003)
    until = g.hold_until(queued=20, full=32, now=5.0003)
    assert until == 5.0 + MAX_WAIT_S                         # the window after the last answer
    for i in range(20, 31):
        g.arrived(i, 5.0006)
    assert g.hold_until(queued=31, full=32, now=5.0006) == until     # one still missing
    assert g.hold_until(queued=32, full=32, now=5.0006) is None      # a full pass is queued
    assert g.hold_until(queued=31, full=32, now=until + 1e-6) is None   # the window passed: not waited again
    assert g.hold_until(queued=31, full=32, now=until + 1.0) is None


def test_a_wait_spends_at_most_what_merging_two_passes_saves():
    g = returning(flat(Gather(), ms=20.0), gap_s=0.012)      # clients back 12 ms after their answer
    assert FIXED_SHARE == 1.0 and g.wait_s() == pytest.approx(0.020, rel=0.05)
    assert g.wait_s() < MAX_WAIT_S
    late = returning(flat(Gather(), ms=20.0), gap_s=0.022)   # later than that window: not waited for
    assert late.wait_s() == 0


def test_clients_a_worker_just_answered_are_expected_back_before_the_next_dispatch():
    """The supervisor dispatches before it sends the tick's replies: the gather must hear of those
    answers when the worker's results arrive, or a free worker leaves with half the clients."""
    now = [7.0]
    clients = [(id(None), b"client-%d" % tag) for tag in range(16)]     # Entry.client of each below
    gather = came_back(returning(flat(Gather())), clients)
    parts = dict.fromkeys(("pool", "run_state", "settings", "notifier", "status_line", "replies", "clears",
                           "reloads", "fail"))       # what taking answers never reaches
    events = WorkerEvents(gather=gather, clock=lambda: now[0], metrics=SimpleNamespace(batches=lambda records: None),
                          counters=SimpleNamespace(mixed_batches=0), **parts)
    entries = {tag: Entry(tag, sock=None, envelope=[b"client-%d" % tag], id=tag, payload=b"", received=6.9,
                          deadline=None) for tag in range(16)}
    worker = SimpleNamespace(inflight=dict(entries), requests=0, take_stats=lambda stats: None, pace=Pace())
    events.take_answers(worker, [[tag, True, {}] for tag in entries], {}, [])
    assert len(events.answered) == 16                       # replies not sent yet: dispatch runs first
    assert gather.hold_until(queued=16, full=32, now=7.0) == 7.0 + MAX_WAIT_S


def test_clients_never_seen_coming_back_are_not_waited_for():
    """One-shot clients (a script that sends one request and exits) never come back: were they waited
    for, every pass they were answered in would hold the next one for a whole window."""
    g = came_back(returning(flat(Gather())), ["loop"])
    for i in range(8):
        g.answered(("one-shot", i), 5.0)
    assert g.wait_s() == MAX_WAIT_S and g.hold_until(queued=1, full=32, now=5.0) is None
    g.answered("loop", 5.0)
    assert g.hold_until(queued=1, full=32, now=5.0) == 5.0 + MAX_WAIT_S
    g.hold_until(queued=1, full=32, now=5.0 + 2 * MAX_WAIT_S)      # "loop" did not come back this time
    g.answered("loop", 6.0)
    assert g.hold_until(queued=1, full=32, now=6.0) is None         # nor is it waited for again, until it does


def test_requests_through_the_http_gateway_are_never_waited_for():
    """Every HTTP request comes on the gateway's one connection: after a burst of them, a lone request
    from anyone would otherwise look like one of many clients about to come back."""
    g = returning(flat(Gather()))
    http = [Entry(tag, sock=None, envelope=[b"gateway"], id=tag, payload=b"", received=1.0, deadline=None,
                  transport="http") for tag in range(8)]
    assert {e.client for e in http} == {None}
    for e in http:
        g.answered(e.client, 1.0)
    g.arrived(http[0].client, 1.001)
    for e in http[1:]:
        g.answered(e.client, 2.0)
    assert g.hold_until(queued=1, full=32, now=2.0) is None
    zmq = Entry(0, sock=None, envelope=[b"c"], id=0, payload=b"", received=1.0, deadline=None)
    assert zmq.client is not None


def test_no_waiting_where_cost_follows_size_or_clients_come_back_late():
    cpu = returning(Gather())
    cpu.passes(records({1: 2.0, 8: 16.0, 32: 64.0}))
    cpu.answered("x", 1.0)
    assert cpu.wait_s() == 0 and cpu.hold_until(1, 32, 1.0) is None
    slow = returning(flat(Gather()), gap_s=0.050)            # clients that think for 50 ms
    slow.answered("x", 1.0)
    assert slow.wait_s() == 0 and slow.hold_until(1, 32, 1.0) is None
    fresh = Gather()                                         # nothing measured yet
    fresh.answered("x", 1.0)
    assert fresh.hold_until(1, 32, 1.0) is None


def test_failed_passes_teach_nothing_and_memory_of_clients_is_bounded():
    g = Gather()
    g.passes([[32, 0, 0, 1.0, False, []], [1, 0, 0, 50.0, False, []]])
    assert g.cost.classes == {}
    for i in range(10_000):
        g.answered(i, 1.0)
    assert len(g._answered) <= 4096
    assert list(g._answered)[-1] == 9_999 and 0 not in g._answered      # the oldest forgotten first


def test_the_window_runs_from_the_last_answer_of_a_client_still_out():
    g = came_back(returning(flat(Gather())), ["out", "back"])
    g.answered("out", 5.0)
    g.answered("back", 5.0015)
    g.arrived("back", 5.0016)                                # back already: nobody waits for it
    assert g.hold_until(queued=1, full=32, now=5.0016) == 5.0 + MAX_WAIT_S


def test_costs_are_smoothed_the_newest_weighing_a_fifth():
    cost = PassCost()
    cost.record(8, 0.010)
    cost.record(12, 0.020)                                   # the same size class, 8-15
    assert cost.classes[size_class(8)] == pytest.approx(((1 - SMOOTHING) * 8 + SMOOTHING * 12,
                                                         (1 - SMOOTHING) * 0.010 + SMOOTHING * 0.020))


def test_how_soon_clients_come_back_is_the_median_of_the_latest_returns():
    g = Gather()
    for i, gap in enumerate([0.001, 0.006, 0.002]):
        g.answered("a", float(i))
        g.arrived("a", i + gap)
    assert g.return_s == pytest.approx(0.002)
    for i in range(RETURN_SAMPLES):                           # the oldest are forgotten
        g.answered("a", 10.0 + i)
        g.arrived("a", 10.0 + i + 0.004)
    assert g.return_s == pytest.approx(0.004) and len(g.returns) == RETURN_SAMPLES


def test_a_few_late_clients_do_not_turn_waiting_off():
    """32 closed-loop clients on a few cores: most come back within the window, the last few late,
    and they are the latest samples when the worker frees. The median still says wait, so the early
    ones are not sent ahead in a pass of their own, nearly a full pass's cost for a handful."""
    g = flat(Gather())
    window = g.max_wait_s
    for cycle in range(3):
        for i in range(32):
            g.answered(i, 10.0 * cycle)
        for i in range(32):
            late = i >= 26
            g.arrived(i, 10.0 * cycle + (4 * window if late else 0.4 * window))
    assert g.wait_s() == window
    for i in range(32):
        g.answered(i, 100.0)
    g.arrived(0, 100.001)
    assert g.hold_until(queued=1, full=32, now=100.001) == 100.0 + window


def test_a_cost_that_falls_with_size_counts_as_flat_never_above_what_a_pass_costs():
    noisy = PassCost()
    for size, ms in {1: 42.0, 8: 41.0, 32: 40.0}.items():   # noise: bigger passes measured cheaper
        noisy.record(size, ms / 1000)
    assert noisy.fixed_s() == pytest.approx(0.041)           # the mean cost, not more than any pass


def test_clients_answered_at_different_times_are_waited_for_until_the_last_is_back_or_its_window_ends():
    """Replies go out over a few turns: the hold lasts a window from the latest answer, each client
    is waited for only within its own window, and it ends the moment every one of them is back."""
    clients = [("late", i) for i in range(3)]
    g = came_back(returning(flat(Gather())), clients)
    for i, client in enumerate(clients):                   # answered at 5.000, 5.001, 5.002
        g.answered(client, 5.0 + i * 0.001)
    until = g.hold_until(queued=1, full=32, now=5.0025)
    assert until == pytest.approx(5.002 + MAX_WAIT_S)       # from the last answer, not the first
    g.arrived(clients[2], 5.003)                            # the last answered is back first
    assert g.hold_until(queued=2, full=32, now=5.003) == pytest.approx(5.001 + MAX_WAIT_S)
    g.arrived(clients[0], 5.0035)
    assert g.hold_until(queued=3, full=32, now=5.0035) == pytest.approx(5.001 + MAX_WAIT_S)
    g.arrived(clients[1], 5.004)                            # all back: no need to wait, though 3 < 32
    assert g.hold_until(queued=4, full=32, now=5.004) is None

    h = came_back(returning(flat(Gather())), clients)
    for i, client in enumerate(clients):
        h.answered(client, 5.0 + i * 0.001)
    h.arrived(clients[2], 5.003)
    # The first's window has passed, the second's not: held for the second alone, until its own bound.
    assert h.hold_until(queued=1, full=32, now=5.0 + MAX_WAIT_S + 0.0005) == pytest.approx(5.001 + MAX_WAIT_S)
    assert h.hold_until(queued=1, full=32, now=5.001 + MAX_WAIT_S + 0.0005) is None
