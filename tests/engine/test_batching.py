"""Batch selection and group commit, on shapes alone (no model)."""
import threading
from collections import deque

from jevany_client.errors import InternalError
from jevany_daemon.engine.batching import BatchLimits, GroupCommit, Pending, drain, padded_cost, take_batch
from tests.server.daemons import wait_for


def queued(gc: GroupCommit) -> int:
    with gc._cond:
        return len(gc._queue)


def P(width, rows=1, real=None, alone=False, name=None):
    return Pending(name, rows, width, rows * width if real is None else real, alone=alone)


def test_oldest_always_goes_first_even_when_others_fit_better():
    q = deque([P(100, name="old"), P(10, name="a"), P(10, name="b")])
    batch = take_batch(q, BatchLimits(8, 10_000, 1.0))
    assert batch[0].item == "old"
    assert len(batch) == 3 and not q


def test_batch_size_limit():
    q = deque(P(10, name=i) for i in range(20))
    batch = take_batch(q, BatchLimits(8, 10_000, 1.0))
    assert [p.item for p in batch] == list(range(8))
    assert [p.item for p in q] == list(range(8, 20))


def test_padded_token_limit_counts_rows_times_longest_width():
    # head: 2 rows x 50 = 100; + (1 row x 60) -> 3 x 60 = 180 > 150, skipped; + (1 x 40) -> 3 x 50 = 150 fits
    q = deque([P(50, rows=2, name="h"), P(60, name="wide"), P(40, name="narrow")])
    batch = take_batch(q, BatchLimits(8, 150, 1.0))
    assert [p.item for p in batch] == ["h", "narrow"]
    assert [p.item for p in q] == ["wide"]
    assert sum(p.rows for p in batch) * max(p.width for p in batch) <= 150


def test_prefers_similar_widths_then_arrival_order():
    q = deque([P(100, name="h"), P(20, name="far"), P(95, name="near1"), P(105, name="near2"), P(98, name="near3")])
    batch = take_batch(q, BatchLimits(3, 10_000, 1.0))
    assert [p.item for p in batch] == ["h", "near3", "near1"]
    assert [p.item for p in q] == ["far", "near2"]


def test_waste_cap_keeps_uneven_requests_apart():
    q = deque([P(400, name="long"), P(40, name="short")])
    batch = take_batch(q, BatchLimits(8, 10_000, 0.25))
    # together: 2 x 400 = 800 padded for 440 real -> 45% waste > 25%
    assert [p.item for p in batch] == ["long"]
    assert [p.item for p in q] == ["short"]


def test_waste_cap_allows_joins_that_do_not_add_waste():
    # the head alone already wastes 50% (two rows of different lengths); an equal-width row adds none
    q = deque([P(100, rows=2, real=100, name="h"), P(100, name="same")])
    batch = take_batch(q, BatchLimits(8, 10_000, 0.1))
    assert [p.item for p in batch] == ["h", "same"]


def test_alone_requests_run_alone():
    q = deque([P(10, alone=True, name="m"), P(10, name="a"), P(10, alone=True, name="m2"), P(10, name="b")])
    assert [p.item for p in take_batch(q, BatchLimits(8, 10_000, 1.0))] == ["m"]
    assert [p.item for p in take_batch(q, BatchLimits(8, 10_000, 1.0))] == ["a", "b"]
    assert [p.item for p in take_batch(q, BatchLimits(8, 10_000, 1.0))] == ["m2"]


def test_drain_scores_everything_and_marks_unscored_items_failed():
    q = deque(P(10, name=i) for i in range(5))
    seen = []

    def run(batch):
        seen.append([p.item for p in batch])
        for p in batch[:-1]:   # "forget" the last one of each batch
            p.outcome, p.done = p.item, True

    items = list(q)
    drain(q, lambda queue: take_batch(queue, BatchLimits(2, 10_000, 1.0)), run)
    assert seen == [[0, 1], [2, 3], [4]]
    assert [p.outcome for p in items[:-1:2]] == [0, 2]
    assert all(p.done for p in items)
    assert isinstance(items[1].outcome, InternalError) and isinstance(items[4].outcome, InternalError)


def test_idle_group_commit_runs_a_lone_request_in_the_callers_thread():
    ran_in = []

    def run(batch):
        ran_in.append((threading.current_thread(), len(batch)))
        for p in batch:
            p.outcome, p.done = "ok", True

    gc = GroupCommit(lambda queue: take_batch(queue, BatchLimits(32, 10_000, 1.0)), run)
    p = gc.submit(P(10))
    # no timer, no helper thread: the caller itself ran a batch of one before returning
    assert p.outcome == "ok"
    assert ran_in == [(threading.current_thread(), 1)]


def test_group_commit_batches_requests_that_arrive_during_a_pass():
    first_running, release = threading.Event(), threading.Event()
    sizes = []

    def run(batch):
        sizes.append(len(batch))
        if len(sizes) == 1:
            first_running.set()
            release.wait(10)
        for p in batch:
            p.outcome, p.done = p.item, True

    gc = GroupCommit(lambda queue: take_batch(queue, BatchLimits(32, 10_000, 1.0)), run)
    results = {}

    def call(i):
        results[i] = gc.submit(P(10, name=i)).outcome

    t0 = threading.Thread(target=call, args=(0,))
    t0.start()
    assert first_running.wait(10)
    others = [threading.Thread(target=call, args=(i,)) for i in range(1, 6)]
    for t in others:
        t.start()
    wait_for(lambda: queued(gc) == 5, 10, "all five queued behind the running pass")
    release.set()
    for t in [t0, *others]:
        t.join(10)
    assert results == {i: i for i in range(6)}
    assert sizes == [1, 5]


def test_a_prefix_run_in_its_own_pass_counts_once_per_request():
    # each request's prefix is a row of its own in the prefix pass: 2 x 10 + 2 x 100 = 220 padded tokens
    two = [Pending(f"r{i}", 1, 10, 110, prefix=100) for i in range(2)]
    assert padded_cost(two) == 220
    batch = take_batch(deque(two), BatchLimits(8, 215, 1.0))
    assert [p.item for p in batch] == ["r0"]          # together they would allocate 220 > 215
    assert [p.item for p in take_batch(deque(two), BatchLimits(8, 220, 1.0))] == ["r0", "r1"]


def test_requests_on_one_stem_are_costed_as_the_one_row_they_make():
    # 31 hits on one kept state, 200-token questions each, and one other request: the pass packs the 31
    # into one row of 6,200 tokens and pads the other's row to it, 12,400 padded tokens in all
    on_stem = [Pending(f"s{i}", 1, 200, 200, stem="state", shared=0, tails=200) for i in range(31)]
    other = Pending("other", 1, 200, 200)
    assert padded_cost(on_stem + [other]) == 2 * 31 * 200
    batch = take_batch(deque([other, *on_stem]), BatchLimits(32, 8192, 1.0))
    # the other's row plus as many on the stem as keep two rows within 8,192: 2 x 20 x 200
    assert len(batch) == 21 and padded_cost(batch) == 8000


def test_a_stem_computed_in_the_pass_is_counted_once_in_its_row():
    # misses on one state: 100 tokens of stem to compute, then 50 of question each; one row of 100 + 4 x 50
    four = [Pending(f"m{i}", 1, 150, 150, stem="state", shared=100, tails=50) for i in range(4)]
    assert padded_cost(four) == 300
    # with the stem counted in every request (600 tokens), 300 real tokens in 300 padded are no waste at all
    assert len(take_batch(deque(four), BatchLimits(8, 300, 0.0))) == 4


def test_a_blended_request_adds_only_its_choice_questions_to_its_stem_row():
    # 7 blended hits on one kept state: 50 tokens of choice questions each on the state's row, and a
    # native row of 550 (the native pass never reads the cache): 8 rows of at most 550, not a stem row
    # grown by 550 a request
    blended = [Pending(f"b{i}", 2, 550, 600, stem="state", shared=0, tails=50) for i in range(7)]
    assert padded_cost(blended) == (2 + 6) * 550
    assert len(take_batch(deque(blended), BatchLimits(32, 8192, 1.0))) == 7
