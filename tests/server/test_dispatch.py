"""The supervisor's dispatch phase (supervisor.py): what a free worker and a busy one are handed.
No processes, no sockets: the Supervisor with stand-in workers, an injected clock and a plain queue."""
from types import SimpleNamespace

from jevany_daemon.server.gather import MAX_WAIT_S, Gather
from jevany_daemon.server.request_queue import Entry
from jevany_daemon.server.supervisor import Supervisor

FULL = 4      # max_batch_size: a full pass


class Worker:
    def __init__(self, available: bool, can_prefetch: bool = True):
        self.available, self.can_prefetch = available, can_prefetch
        self.handed: list[list[int]] = []

    def hand_over(self, backend, entries, now):
        self.handed.append([e.tag for e in entries])


def supervisor(workers, queued: int, gather: Gather | None = None, now: float = 10.0) -> Supervisor:
    settings = SimpleNamespace(max_queue=100, engine=SimpleNamespace(max_batch_size=FULL))
    sup = Supervisor(settings, clock=lambda: now, env={})
    if gather is not None:
        sup.gather = gather
    sup.wiring = SimpleNamespace(pool=SimpleNamespace(serving=lambda: list(workers)), backend=object(),
                                 peers=SimpleNamespace(read=lambda: None, alive=lambda peer: True))
    for tag in range(queued):
        sup.queue.push(Entry(tag, sock=None, envelope=[b"c%d" % tag], id=tag, payload=b"", received=9.0,
                             deadline=None))
    return sup


def test_a_free_worker_takes_what_is_queued_up_to_a_full_pass():
    free = Worker(available=True)
    sup = supervisor([free], queued=6)
    sup.dispatch()
    assert free.handed == [[0, 1, 2, 3]] and len(sup.queue) == 2
    one = Worker(available=True)
    sup = supervisor([one], queued=1)
    sup.dispatch()
    assert one.handed == [[0]] and len(sup.queue) == 0          # a free worker does not wait for a full pass


def test_a_busy_worker_takes_only_a_full_pass_and_only_when_it_can_prefetch():
    busy = Worker(available=False)
    sup = supervisor([busy], queued=FULL - 1)
    sup.dispatch()
    assert busy.handed == [] and len(sup.queue) == FULL - 1    # less than a full pass: it waits
    exactly = Worker(available=False)
    sup = supervisor([exactly], queued=FULL)
    sup.dispatch()
    assert exactly.handed == [[0, 1, 2, 3]] and len(sup.queue) == 0   # exactly a full pass: taken
    more = Worker(available=False)
    sup = supervisor([more], queued=FULL + 3)
    sup.dispatch()
    assert more.handed == [[0, 1, 2, 3]] and len(sup.queue) == 3       # a full pass, not everything
    cannot = Worker(available=False, can_prefetch=False)
    sup = supervisor([cannot], queued=FULL * 2)
    sup.dispatch()
    assert cannot.handed == [] and len(sup.queue) == FULL * 2


def test_workers_take_in_turn_until_the_queue_is_empty():
    busy, free, spare = Worker(available=False), Worker(available=True), Worker(available=True)
    sup = supervisor([busy, free, spare], queued=FULL + 2)
    sup.dispatch()
    assert busy.handed == [[0, 1, 2, 3]] and free.handed == [[4, 5]] and spare.handed == []
    assert len(sup.queue) == 0


def test_a_free_worker_holds_for_answered_clients_and_the_loop_wakes_at_the_hold():
    gather = Gather()
    gather.passes([[size, 0, 0, ms, True, []] for _ in range(5) for size, ms in {1: 80.0, 8: 81.0, 32: 82.0}.items()])
    for i in range(8):                                         # clients that come back at once after an answer
        gather.answered(("c", i), 1.0)
        gather.arrived(("c", i), 1.0005)
    for i in range(FULL):
        gather.answered(("c", i), 10.0)
    free = Worker(available=True)
    sup = supervisor([free], queued=2, gather=gather)
    sup.dispatch()
    assert free.handed == [] and sup._gather_until == 10.0 + MAX_WAIT_S
    late = supervisor([free], queued=2, gather=gather, now=10.0 + MAX_WAIT_S + 0.001)
    late.dispatch()                                            # the window passed: the queue is taken
    assert free.handed == [[0, 1]] and late._gather_until is None
