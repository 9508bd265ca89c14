"""JevClient's promises about replies and retries, seen from the fake daemon's side of the socket:
a duplicate reply is dropped, a control op is sent once, and retry pauses double from 50 ms."""
import itertools
import math
import os
import random
import threading
import time

import pytest
import zmq

from jevany_client import JevClient, Noul, OverloadedError, ShuttingDownError, decide_body
from jevany_client.calls import REMAINING, Exchange, Pause
from jevany_client.protocol import decode_request, ok_reply, pack

QUESTIONS = {"ok": Noul()}
_keys = itertools.count()


def fake_status(daemon) -> dict:
    with JevClient(daemon.endpoint, timeout=5.0) as client:
        return client.status()


def test_a_duplicate_reply_is_discarded_never_handed_to_the_next_call(daemon):
    with JevClient(daemon.endpoint, timeout=10.0, retries=0) as client:
        first = client.decide({"duplicate_after": 0.2, "n": 1}, QUESTIONS)
        # the duplicate of the first reply comes while this call waits for its own
        second = client.decide({"delay": 0.6, "n": 2}, QUESTIONS)
        assert client.discarded == 1                       # the duplicate came, and was dropped
        bodies = [{"duplicate_after": 0, "n": n} for n in (3, 4, 5)]
        many = client.decide_many([{"state": b, "questions": {"ok": {"type": "noul"}}} for b in bodies])
        last = client.decide("plain", QUESTIONS)
    assert first["state"]["n"] == 1 and second["state"]["n"] == 2
    # The duplicate went out between the two replies (the fake daemon is shared: other tests' late
    # replies may go out in between too, so at least one reply, not exactly one).
    assert second["order"] >= first["order"] + 2
    assert [r["state"]["n"] for r in many] == [3, 4, 5]
    assert last["state"] == "plain"


@pytest.mark.parametrize("op,code,error", [("reload", "overloaded", OverloadedError),
                                           ("drain", "shutting_down", ShuttingDownError),
                                           ("clear_cache", "overloaded", OverloadedError)])
def test_control_ops_are_sent_once_even_when_the_error_is_retryable(daemon, op, code, error):
    before = fake_status(daemon)["requests"]["by_error_code"].get(code, 0)
    with JevClient(daemon.control, timeout=10.0, retries=3) as control:
        with pytest.raises(error) as err:
            control.call(op, {"error": code})
        assert err.value.retryable
    assert fake_status(daemon)["requests"]["by_error_code"][code] == before + 1


def test_retry_pauses_double_from_50_ms(daemon):
    key = f"backoff-{os.getpid()}-{next(_keys)}"
    with JevClient(daemon.endpoint, timeout=30.0, retries=4) as client:
        with pytest.raises(OverloadedError):
            client.decide({"record": key, "error": "overloaded"}, QUESTIONS)
    arrivals = fake_status(daemon)["arrivals"][key]
    assert len(arrivals) == 5                                # the first try and four retries
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    # Pause k is 50 ms x 2^k, jittered down to half at most; a gap also holds a round trip, so
    # only the lower bounds are certain (a sleep never ends early).
    for k, gap in enumerate(gaps):
        assert gap >= 0.05 * 2**k * 0.5, (k, gaps)


@pytest.mark.parametrize("jitter", ["longest", "shortest"])
def test_the_retry_pauses_are_exactly_50_ms_doubling_to_1_s_with_at_most_half_taken_off(monkeypatch, jitter):
    """The pauses a call asks for, read off its tries without sleeping: upper and lower bounds both."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high if jitter == "longest" else low)
    client = JevClient("tcp://127.0.0.1:9", timeout=None, retries=7)     # never connected: nothing is sent
    tries = client._tries("decide", [decide_body("s", QUESTIONS)], None, None, False)
    pauses, step, sent = [], next(tries), 0
    try:
        while True:
            if isinstance(step, Exchange):
                sent += 1
                step = tries.send({rid: OverloadedError("busy", request_id=rid) for rid, _ in step.requests})
            else:
                assert isinstance(step, Pause)
                pauses.append(step.seconds)
                step = tries.send(None)
    except StopIteration as done:
        [outcome] = done.value
    finally:
        client.close()
    assert isinstance(outcome, OverloadedError) and sent == 8            # the first try and seven retries
    full = [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert pauses == pytest.approx(full if jitter == "longest" else [p / 2 for p in full])


def test_each_try_tells_the_daemon_the_time_the_call_has_left():
    """timeout_ms of each try is what the call has left then, in milliseconds: the daemon answers
    deadline_exceeded rather than score a request the caller has stopped waiting for."""
    client = JevClient("tcp://127.0.0.1:9", timeout=None, retries=3)     # never connected: nothing is sent
    tries = client._tries("decide", [decide_body("s", QUESTIONS)], 2.0, REMAINING, False)
    started, told, paused = time.monotonic(), [], 0.0
    step = next(tries)
    try:
        while True:
            if isinstance(step, Exchange):
                [(rid, payload)] = step.requests
                told.append((decode_request(payload).timeout_ms, step.wait, paused))
                step = tries.send({rid: OverloadedError("busy", request_id=rid)})
            else:
                time.sleep(step.seconds)
                paused += step.seconds
                step = tries.send(None)
    except StopIteration:
        pass
    finally:
        client.close()
    assert len(told) == 4 and time.monotonic() - started < 2.0
    for ms, wait, paused_before in told:
        assert ms == math.ceil(wait * 1000)                 # the round's own wait, in milliseconds
        assert 2000 - 1000 * (time.monotonic() - started) <= ms <= 2000 - 1000 * paused_before + 1


def test_a_decide_with_a_30_s_timeout_tells_the_daemon_about_30000_ms(socket_dir):
    """The test above drives a call's tries by hand; this one is decide as a caller makes it, the request
    read off the socket by a stand-in daemon: its timeout_ms is the 30 s the call has left, in milliseconds."""
    endpoint = f"ipc://{socket_dir}/records-timeout.sock"
    context = zmq.Context()
    daemon = context.socket(zmq.ROUTER)
    daemon.setsockopt(zmq.LINGER, 0)
    daemon.bind(endpoint)
    told = []

    def answer_one() -> None:
        if daemon.poll(10_000):
            *envelope, payload = daemon.recv_multipart()
            request = decode_request(payload)
            told.append((request.op, request.timeout_ms))
            result = {"model": "fake-tiny", "answers": {}, "latency_ms": 0.0, "state": request.body["state"],
                      "usage": {"input_tokens": 0, "output_tokens": 0}}
            daemon.send_multipart([*envelope, pack(ok_reply(request.id, result))])

    server = threading.Thread(target=answer_one, daemon=True)
    server.start()
    try:
        with JevClient(endpoint, timeout=30.0, retries=0) as client:
            result = client.decide("s", QUESTIONS)
    finally:
        server.join(15)
        context.destroy(linger=0)
    assert result["state"] == "s"
    [(op, timeout_ms)] = told
    assert op == "decide" and 29_000 <= timeout_ms <= 30_000
