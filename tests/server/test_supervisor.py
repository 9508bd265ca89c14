"""The supervisor's loop phases one at a time: how long it waits, what a signal starts, when a drain ends,
which descriptors are busy, when the watchdog is fed. No processes: the Supervisor with stand-ins for what
lifecycle.py would open (test_dispatch.py holds the dispatch phase, test_signals_after_drain.py a drain's signals)."""
import signal
from types import SimpleNamespace

from jevany_daemon.server.outbox import Envelope
from jevany_daemon.server.peers import Peer
from jevany_daemon.server.request_queue import Entry
from jevany_daemon.server.supervisor import IDLE_WAIT_MS, Supervisor


class Poller:
    def __init__(self):
        self.timeouts = []

    def poll(self, timeout):
        self.timeouts.append(timeout)
        return []


class Notifier:
    watchdog_s = None

    def __init__(self):
        self.said = []

    def watchdog(self):
        self.said.append("WATCHDOG")

    def status(self, line):
        self.said.append("STATUS")

    def stopping(self, line):
        self.said.append("STOPPING")


class Replies:
    def __init__(self):
        self.errors, self.drained_told = [], []

    def reply_error(self, entry, err, noted=False):
        self.errors.append((entry.tag, err.code))

    def drained(self, waiters):
        self.drained_told.append(waiters)


def entry(tag: int, deadline: float | None = None, fd: int | None = None) -> Entry:
    return Entry(tag, sock=None, envelope=Envelope.of([b"c"], Peer(fd, 1)), id=tag, payload=b"", received=0.0,
                 deadline=deadline)


def supervisor(now: float = 10.0, workers=(), media=None) -> Supervisor:
    settings = SimpleNamespace(max_queue=100, engine=SimpleNamespace(max_batch_size=4))
    sup = Supervisor(settings, clock=lambda: now, env={})
    pool = SimpleNamespace(workers=list(workers), inflight=lambda: sum(len(w.inflight) for w in workers))
    sup.wiring = SimpleNamespace(poller=Poller(), gateway=None, media=media, pool=pool, metrics_url=None,
                                 outbox=SimpleNamespace(dropped=SimpleNamespace(flush=lambda: None),
                                                        forget_gone=lambda: None))
    sup.notifier, sup.replies, sup.status_line = Notifier(), Replies(), lambda: "up"
    begun = []
    sup.reloads = SimpleNamespace(cancel=lambda why: None, begun=begun, begin=lambda cause: begun.append(cause))
    return sup


def test_the_loop_waits_until_the_next_deadline_in_milliseconds_and_never_past_its_idle_bound():
    sup = supervisor(now=10.0)
    sup.wait()
    sup.queue.push(entry(1, deadline=10.05))
    sup.wait()
    assert sup.wiring.poller.timeouts == [IDLE_WAIT_MS, 51]       # a millisecond past the deadline, not before it


def test_sighup_reloads_and_drains_nothing():
    sup = supervisor()
    sup.wiring.signals = SimpleNamespace(take=lambda: [signal.SIGHUP])
    sup.handle_signals()
    assert sup.reloads.begun == ["SIGHUP"] and sup.run_state.state == "starting"


def test_a_drain_ends_only_once_no_worker_holds_a_request():
    holding = SimpleNamespace(inflight={7: entry(7)})
    sup = supervisor(workers=[holding])
    sup.run_state.ready()
    sup.begin_drain(exiting=False, cause="drain op")
    sup.run_state.await_drain(("sock", [b"id"], "d"))
    sup.finish_drain()
    assert sup.replies.drained_told == [] and sup.run_state.state == "draining"
    holding.inflight.clear()
    sup.finish_drain()
    assert sup.replies.drained_told == [[("sock", [b"id"], "d")]] and sup.run_state.state == "drained"


def test_requests_waiting_for_their_media_check_expire_with_the_queued_ones():
    checked = entry(2, deadline=5.0)
    media = SimpleNamespace(take_expired=lambda now: [checked])
    sup = supervisor(now=10.0, media=media)
    sup.queue.push(entry(1, deadline=9.0))
    sup.expire_deadlines()
    assert sup.replies.errors == [(1, "deadline_exceeded"), (2, "deadline_exceeded")]


def test_the_peers_of_queued_and_handed_over_requests_are_busy():
    handed = SimpleNamespace(inflight={3: entry(3, fd=13)})
    sup = supervisor(workers=[handed])
    sup.queue.push(entry(1, fd=11))
    assert sup.busy_fds() == {11, 13}


def test_the_watchdog_is_fed_on_the_first_report_and_then_once_an_interval():
    now = [10.0]
    sup = supervisor()
    sup.clock = lambda: now[0]
    sup.notifier.watchdog_s = 1.0
    sup.report()
    now[0] = 10.5
    sup.report()
    now[0] = 11.0
    sup.report()
    assert sup.notifier.said.count("WATCHDOG") == 2


def test_a_failure_stops_without_waiting_for_the_queue():
    sup = supervisor()
    sup.fail("worker 0 exited before loading the model (exit code 1)", exit_code=1)
    assert sup.run_state.stopping and sup.run_state.stopping_now and sup.run_state.exit_code == 1
