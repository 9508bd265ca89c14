"""clear_cache across the pool: the total once every worker asked has answered or died (no daemon)."""
from jevany_daemon.server.cache_clears import CacheClears


def test_the_total_is_every_answer_summed_and_comes_once_the_last_worker_answers():
    clears = CacheClears()
    clears.begin("waiter", {b"w1", b"w2", b"w3"})
    assert clears.answered(b"w1", 4) == []
    assert clears.gone(b"w2") == []          # a dead worker's cache went with it: it counts 0
    assert clears.answered(b"w3", 5) == [("waiter", 9)]
    assert clears.answered(b"w3", 5) == []   # told once


def test_a_worker_counts_only_toward_the_clears_that_asked_it():
    clears = CacheClears()
    # Two clears at once, of different workers (one became ready between them): each total is its own.
    clears.begin("first", {b"w1"})
    clears.begin("second", {b"w1", b"w2"})
    assert clears.answered(b"w2", 3) == []
    assert clears.answered(b"w1", 2) == [("first", 2), ("second", 5)]
