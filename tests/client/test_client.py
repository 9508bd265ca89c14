import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest

from jevany_client import (
    ERROR_CLASSES,
    Choice,
    InvalidRequestError,
    JevanyError,
    JevClient,
    JevTimeoutError,
    JevUnreachableError,
    Noul,
    OverloadedError,
    decide_body,
)
from jevany_client.protocol import MAX_ID_BYTES

QUESTIONS = {"pick": Choice(["red", "blue"]), "ok": Noul()}


@pytest.fixture
def client(daemon):
    with JevClient(daemon.endpoint, timeout=5.0) as c:
        yield c


def test_ping_status_models_round_trip(client):
    pong = client.ping()
    assert (pong["pong"], pong["version"]) == (True, "test")
    status = client.status()
    assert status["state"] == "ready"
    assert status["model"]["id"] == "fake-tiny"
    assert client.models()["models"][0]["alias"] == "jevany-latest"


def test_decide_sends_the_wire_body_and_returns_the_result(client):
    result = client.decide({"turn": 3}, QUESTIONS, model="jevany-latest")
    assert result["state"] == {"turn": 3}
    assert result["model"] == "fake-tiny"
    assert result["server"] == "alpha"


def test_decide_body_converts_builders_and_media():
    from jevany_client import Media

    media = [Media("image", "a.png"), {"type": "video", "uri": "b"}]
    body = decide_body("s", QUESTIONS, media=media)
    assert body == {
        "state": "s",
        "questions": {"pick": {"type": "choice", "criteria": {"red": None, "blue": None}},
                      "ok": {"type": "noul"}},
        "media": [{"type": "image", "uri": "a.png"}, {"type": "video", "uri": "b"}],
    }


def test_decide_takes_image_and_video_builders(client):
    from pathlib import Path

    from jevany_client import Image, Video

    result = client.decide("s", QUESTIONS, media=[Image("a.png"), Video(Path("clips/b.mp4"))])
    assert result["media"] == [{"type": "image", "uri": "a.png"}, {"type": "video", "uri": "clips/b.mp4"}]
    many = client.decide_many([{"state": "s", "questions": QUESTIONS, "media": [Image("c.png")]}])
    assert many[0]["media"] == [{"type": "image", "uri": "c.png"}]


@pytest.mark.parametrize("code", sorted(ERROR_CLASSES))
def test_error_replies_raise_their_typed_class(client, code):
    cls = ERROR_CLASSES[code]
    with pytest.raises(cls) as caught:
        client.decide(f"error:{code}", QUESTIONS)
    err = caught.value
    assert type(err) is cls
    assert (err.code, err.message, err.retryable) == (code, f"fake {code}", cls.retryable)
    assert isinstance(err.request_id, str)


def test_unknown_error_code_keeps_code_and_retry_advice(client):
    with pytest.raises(JevanyError) as caught:
        client.decide("error:rate_limited", QUESTIONS)
    assert type(caught.value) is JevanyError
    assert (caught.value.code, caught.value.retryable) == ("rate_limited", True)


def test_control_op_on_public_endpoint_is_forbidden(client):
    with pytest.raises(JevanyError) as caught:
        client.clear_cache()
    assert caught.value.code == "forbidden"


def test_control_ops_on_control_endpoint(daemon):
    with JevClient(daemon.control, timeout=5.0) as control:
        assert control.clear_cache()["op"] == "clear_cache"
        assert control.drain()["op"] == "drain"
        assert control.reload()["op"] == "reload"


def test_timeout_leaves_client_usable_and_drops_the_stale_reply(client):
    with pytest.raises(JevTimeoutError) as caught:
        client.decide({"delay": 0.5, "tag": "first"}, QUESTIONS, timeout=0.1)
    err = caught.value
    assert isinstance(err, TimeoutError) and isinstance(err, JevanyError)
    assert (err.code, err.retryable, err.sent) == ("timeout", True, True)
    assert "timeout" not in ERROR_CLASSES
    # Due after the first one's late reply, so that reply reaches this call first.
    result = client.decide({"delay": 0.5, "tag": "second"}, QUESTIONS, timeout=5.0)
    assert result["state"] == {"delay": 0.5, "tag": "second"}
    assert client.discarded == 1


def test_slow_reply_does_not_hold_up_others(daemon):
    # The slow reply is due in 120 s; the fast call's 30 s are plenty on a loaded machine, and a fast
    # reply held behind the slow one would miss them.
    with JevClient(daemon.endpoint, timeout=5.0) as slow, JevClient(daemon.endpoint, timeout=30.0) as fast:
        with pytest.raises(JevTimeoutError):
            slow.decide({"delay": 120, "tag": "slow"}, QUESTIONS, timeout=0.05)
        assert fast.decide("quick", QUESTIONS)["state"] == "quick"


def test_a_message_over_the_daemons_limit_is_refused_at_once_naming_it(client):
    """ZeroMQ would drop it with no reply, and the caller would wait out a timeout that looks like a dead daemon."""
    started = time.monotonic()
    with pytest.raises(InvalidRequestError) as caught:
        client.decide("x" * (2 << 20), QUESTIONS, timeout=30)
    assert time.monotonic() - started < 30 / 2      # not the timeout waited out (generous: a loaded machine)
    assert "accepts at most 1,048,576 (its --max-message-bytes, JEVANY_MAX_MESSAGE_BYTES)" in caught.value.message
    assert client.decide("y" * (200 << 10), QUESTIONS)["state"] == "y" * (200 << 10)   # large, within the limit
    results = client.decide_many([decide_body("x" * (2 << 20), QUESTIONS), decide_body("s", QUESTIONS)],
                                 return_exceptions=True)
    assert isinstance(results[0], InvalidRequestError) and results[1]["state"] == "s"


def test_no_socket_file_fails_at_once(nowhere):
    with JevClient(nowhere, timeout=30) as client:
        started = time.monotonic()
        with pytest.raises(JevUnreachableError) as caught:
            client.ping()
        assert time.monotonic() - started < 30 / 2      # not the timeout waited out
        assert caught.value.sent is False and isinstance(caught.value, JevTimeoutError)
        assert caught.value.message.startswith(f"no daemon at {nowhere[len('ipc://'):]}: no socket file there")
        assert "the default endpoint is ipc://" in caught.value.message
        results = client.decide_many([decide_body("s", QUESTIONS)] * 2, return_exceptions=True)
        assert all(isinstance(r, JevUnreachableError) for r in results)


def test_unreachable_daemon_times_out_without_sending(stale):
    with JevClient(stale, timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(JevTimeoutError) as caught:
            client.ping()
        assert time.monotonic() - started < 0.3 + 10    # its timeout, not a hang (generous: a loaded machine)
        assert caught.value.sent is False
        assert "not reachable" in caught.value.message


def test_decide_many_returns_request_order_though_replies_come_reversed(client):
    bodies = [decide_body({"group": "reverse", "size": 5, "i": i}, QUESTIONS) for i in range(5)]
    results = client.decide_many(bodies)
    assert [r["state"]["i"] for r in results] == list(range(5))
    orders = [r["order"] for r in results]
    assert orders == sorted(orders, reverse=True)  # the last request was answered first


def test_decide_many_takes_what_decide_takes(client):
    """Typed questions in a body written by hand are sent as their wire form, as decide sends them."""
    typed = {"state": "s", "questions": {"pick": Choice(["red", "blue"]), "ok": {"type": "noul"}}}
    results = client.decide_many([typed, decide_body("t", QUESTIONS)])
    assert [r["questions"] for r in results] == [
        {"pick": {"type": "choice", "criteria": {"red": None, "blue": None}}, "ok": {"type": "noul"}},
        decide_body("t", QUESTIONS)["questions"]]
    assert typed["questions"]["pick"] == Choice(["red", "blue"])     # the caller's body is left as it was
    oddity = client.decide_many([{"state": "s", "questions": {"q": 3}}], return_exceptions=True)
    assert oddity[0]["questions"] == {"q": 3}       # not a question: the daemon's to refuse, in place


def test_decide_many_errors_in_place_or_raised_after_collecting(client):
    bodies = [decide_body(s, QUESTIONS) for s in ("a", "error:overloaded", "c", "error:internal")]
    results = client.decide_many(bodies, return_exceptions=True)
    assert [r["state"] for r in results[::2]] == ["a", "c"]
    assert isinstance(results[1], OverloadedError) and results[3].code == "internal"
    with pytest.raises(OverloadedError):
        client.decide_many(bodies)
    assert client.ping()["pong"] is True
    assert client.discarded == 0  # every reply was collected before the raise


def test_unsendable_body_is_a_local_invalid_request(client):
    bad = {"state": {1, 2}, "questions": {}}
    with pytest.raises(InvalidRequestError):
        client.decide_many([decide_body("a", QUESTIONS), bad])
    results = client.decide_many([decide_body("a", QUESTIONS), bad], return_exceptions=True)
    assert results[0]["state"] == "a"
    assert isinstance(results[1], InvalidRequestError)


def test_ids_are_unique_and_short():
    one, two = JevClient("ipc:///nowhere"), JevClient("ipc:///nowhere")
    ids = {one._next_id() for _ in range(100)} | {two._next_id() for _ in range(100)}
    assert len(ids) == 200
    assert max(len(i.encode()) for i in ids) <= MAX_ID_BYTES


def _child_decides(client, queue):
    try:
        inherited = [peer.socket for peer in client._fleet.peers.values()]  # held, so no new socket reuses an id
        state = f"child-{os.getpid()}"
        result = client.decide(state, QUESTIONS)
        mine = [peer.socket for peer in client._fleet.peers.values()]
        queue.put((result["state"] == state, not any(a is b for a in mine for b in inherited)))
    except BaseException as exc:  # report, do not hang the parent
        queue.put(repr(exc))


def test_forked_child_uses_its_own_socket(client):
    assert client.decide("parent-before", QUESTIONS)["state"] == "parent-before"
    queue = multiprocessing.get_context("fork").SimpleQueue()
    child = multiprocessing.get_context("fork").Process(
        target=_child_decides, args=(client, queue)
    )
    child.start()
    try:
        child.join(timeout=15)
        assert child.exitcode == 0
        assert queue.get() == (True, True)
    finally:
        if child.is_alive():
            child.kill()
            child.join(timeout=5)
    assert client.decide("parent-after", QUESTIONS)["state"] == "parent-after"
    assert client.discarded == 0


def test_another_thread_may_not_use_the_client(client):
    client.ping()
    caught = []

    def use():
        try:
            client.ping()
        except RuntimeError as exc:
            caught.append(exc)

    thread = threading.Thread(target=use)
    thread.start()
    thread.join(timeout=10)
    assert len(caught) == 1
    assert "one JevClient per thread" in str(caught[0])
    assert client.ping()["pong"] is True


def test_client_belongs_to_the_thread_that_first_uses_it(daemon):
    client = JevClient(daemon.endpoint, timeout=5.0)
    results = []
    thread = threading.Thread(target=lambda: results.append(client.ping()))
    thread.start()
    thread.join(timeout=10)
    assert results and results[0]["pong"] is True
    with pytest.raises(RuntimeError, match="another thread"):
        client.ping()
    client.close()  # allowed from any thread once the owner is done


def test_one_client_spreads_over_several_endpoints(daemon, beta):
    with JevClient([daemon.endpoint, beta.endpoint], timeout=5.0) as client:
        seen = set()
        deadline = time.monotonic() + 10
        while seen != {"alpha", "beta"} and time.monotonic() < deadline:
            bodies = [decide_body(i, QUESTIONS) for i in range(4)]
            seen |= {r["server"] for r in client.decide_many(bodies)}
        assert seen == {"alpha", "beta"}


def test_closed_client_refuses_calls(daemon):
    client = JevClient(daemon.endpoint)
    client.ping()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.ping()


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), True, "3"])
def test_bad_timeouts_are_refused(timeout):
    with pytest.raises(ValueError):
        JevClient("ipc:///nowhere", timeout=timeout)


def test_default_endpoint_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("JEVANY_ENDPOINT", "tcp://127.0.0.1:5999")
    assert JevClient().endpoints == ["tcp://127.0.0.1:5999"]


def test_importing_the_client_pulls_in_no_model_stack():
    code = (
        "import sys\n"
        "from jevany_client import JevClient\n"
        "assert 'zmq' in sys.modules\n"
        "heavy = ('torch', 'transformers', 'typer', 'numpy')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == ""
