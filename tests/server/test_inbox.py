"""Client messages as the loop takes them in: only routing frames as envelopes, at their bounds exactly
(real ZeroMQ sockets over inproc, no daemon)."""
import time

import pytest
import zmq

from jevany_daemon.server.inbox import MAX_ENVELOPE_FRAMES, MAX_ROUTING_FRAME, Inbox


class NoPeers:
    def read(self):
        pass


@pytest.fixture
def pair():
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.bind("inproc://inbox")
    dealer.connect("inproc://inbox")
    try:
        yield router, dealer
    finally:
        ctx.destroy(linger=0)


def _take_one(router, dealer, frames: list) -> tuple[Inbox, list]:
    """Send frames from the DEALER (the ROUTER puts the routing id before them) and take them in."""
    dealer.send_multipart(frames)
    assert router.poll(10_000), "the message never came"
    inbox, taken = Inbox(NoPeers(), time.monotonic), []
    inbox.take([router], lambda sock, envelope, payload: taken.append((list(envelope), payload)))
    return inbox, taken


def test_an_envelope_of_exactly_the_most_frames_is_taken_and_one_more_is_refused(pair):
    router, dealer = pair
    # The ROUTER's routing id is the first frame of the envelope: MAX_ENVELOPE_FRAMES - 1 of the sender's.
    inbox, taken = _take_one(router, dealer, [b"hop"] * (MAX_ENVELOPE_FRAMES - 1) + [b"payload"])
    assert inbox.refused == 0 and len(taken) == 1
    assert len(taken[0][0]) == MAX_ENVELOPE_FRAMES and taken[0][1] == b"payload"
    inbox, taken = _take_one(router, dealer, [b"hop"] * MAX_ENVELOPE_FRAMES + [b"payload"])
    assert inbox.refused == 1 and taken == []


def test_a_routing_frame_of_exactly_the_most_bytes_is_taken_and_one_byte_more_is_refused(pair):
    router, dealer = pair
    inbox, taken = _take_one(router, dealer, [b"r" * MAX_ROUTING_FRAME, b"payload"])
    assert inbox.refused == 0 and taken[0][0][1] == b"r" * MAX_ROUTING_FRAME
    inbox, taken = _take_one(router, dealer, [b"r" * (MAX_ROUTING_FRAME + 1), b"payload"])
    assert inbox.refused == 1 and taken == []
