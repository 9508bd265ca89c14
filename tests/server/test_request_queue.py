"""The queue of decide requests: order, and the deadlines it keeps count of (no daemon)."""
from jevany_daemon.server.request_queue import Entry, RequestQueue


def entry(tag: int, deadline: float | None = None) -> Entry:
    return Entry(tag, sock=None, envelope=[b"c%d" % tag], id=tag, payload=b"", received=0.0, deadline=deadline)


def test_requests_are_taken_oldest_first_and_never_more_than_wait():
    queue = RequestQueue(max_depth=8)
    for tag in (1, 2, 3):
        queue.push(entry(tag))
    assert [e.tag for e in queue.take(2)] == [1, 2]
    assert [e.tag for e in queue.take(5)] == [3]
    assert queue.take(1) == [] and len(queue) == 0


def test_a_deadline_reached_exactly_expires_and_a_later_one_waits():
    queue = RequestQueue(max_depth=8)
    queue.push(entry(1, deadline=5.0))
    queue.push(entry(2, deadline=6.0))
    queue.push(entry(3))
    assert [e.tag for e in queue.take_expired(5.0)] == [1]
    assert [e.tag for e in queue] == [2, 3]
    assert queue.next_deadline() == 6.0


def test_the_deadlines_left_are_known_after_requests_without_one_are_taken():
    # The queue counts the requests that have a deadline so that a queue without any is not scanned;
    # taking one without a deadline must leave that count to the ones still waiting.
    queue = RequestQueue(max_depth=8)
    queue.push(entry(1))
    queue.push(entry(2, deadline=3.0))
    queue.take(1)
    assert queue.next_deadline() == 3.0
    assert [e.tag for e in queue.take_expired(3.0)] == [2]


def test_a_queue_of_requests_without_deadlines_has_no_next_deadline():
    queue = RequestQueue(max_depth=8)
    queue.push(entry(1))
    queue.push(entry(2))
    assert queue.next_deadline() is None
    assert queue.take_expired(1e9) == []
    assert [e.tag for e in queue.take_all()] == [1, 2]


def test_a_queue_holding_max_depth_requests_is_full_and_one_fewer_is_not():
    # full is what turns the next decide away as overloaded: max_depth waiting is the bound, not one past it.
    queue = RequestQueue(max_depth=3)
    for tag in (1, 2):
        queue.push(entry(tag))
    assert not queue.full
    queue.push(entry(3))
    assert queue.full
    queue.take(1)
    assert not queue.full


def test_withdrawing_the_only_request_with_a_deadline_leaves_no_next_deadline():
    # The count of requests with deadlines must drop with a withdrawal too, else next_deadline scans
    # for a deadline no queued request has (min of nothing) and the supervisor's loop breaks on it.
    queue = RequestQueue(max_depth=8)
    queue.push(entry(1))
    queue.push(entry(2, deadline=4.0))
    assert queue.withdraw(lambda e: e.tag == 2).tag == 2
    assert queue.next_deadline() is None
    assert queue.take_expired(1e9) == []
    assert [e.tag for e in queue] == [1]
