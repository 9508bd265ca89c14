"""What a reply's code promises about scoring, through a real daemon: deadline_exceeded and overloaded
mean the worker never scored the request; internal stays with its request; option caps hold on the wire;
--log-requests logs each request once, queued or refused.

The worker is held still with SIGSTOP so a request certainly waits in the queue; "never scored" is read
from the worker's own count of requests scored, which the daemon reports in status.
"""
import time

import pytest

from jevany_client import InternalError, InvalidRequestError
from jevany_daemon import workloads

from .daemons import wait_for
from .shared_daemons import Raw, fault_env, frozen, running_daemon, serving_worker

BODIES = workloads.short(4, seed=31)
DEADLINE_MS = 300


@pytest.fixture(scope="module")
def triggers(tmp_path_factory):
    return tmp_path_factory.mktemp("triggers")


@pytest.fixture(scope="module")
def daemon(tiny_model, triggers):
    # One waiting request fills the queue; a frozen worker must not count as hung meanwhile.
    with running_daemon(tiny_model("qwen3", "choice"), "--max-queue", "1", "--heartbeat-timeout", "60",
                        "--log-requests", env=fault_env(triggers)) as d:
        yield d


def scored(daemon) -> tuple[int, int]:
    """(requests the workers scored, requests the serving worker scored)."""
    status = daemon.status()
    [worker] = [w for w in status["workers"] if w["role"] == "serving"]
    return status["batching"]["requests"], worker["requests"]


def code(reply: dict) -> str:
    return "ok" if reply["ok"] else reply["error"]["code"]


def test_a_request_past_its_deadline_is_answered_deadline_exceeded_and_never_scored(daemon):
    before = scored(daemon)
    worker = serving_worker(daemon)
    with Raw(daemon.endpoint) as raw:
        with frozen(worker["pid"]):
            raw.send("held", "decide", BODIES[0])
            wait_for(lambda: serving_worker(daemon)["inflight"] == 1, 30, "the first request handed over")
            raw.send("late", "decide", BODIES[1], timeout_ms=DEADLINE_MS)     # waits behind it
            late = raw.recv()              # answered while the worker still cannot score anything
            assert (late["id"], code(late), late["error"]["retryable"]) == ("late", "deadline_exceeded", True)
            assert daemon.status()["queue"]["depth"] == 0
        held = raw.recv()
    assert (held["id"], code(held)) == ("held", "ok")
    assert scored(daemon) == (before[0] + 1, before[1] + 1)        # the late one never reached the model


def test_deadline_exceeded_comes_once_timeout_ms_has_passed_and_soon_after(daemon):
    """Timed from the client: no sooner than timeout_ms after the send (the daemon counts from the
    request's arrival, which is later), and within half a second of it (the supervisor sleeps until
    the nearest deadline)."""
    worker = serving_worker(daemon)
    with Raw(daemon.endpoint) as raw:
        with frozen(worker["pid"]):
            raw.send("held-timed", "decide", BODIES[0])
            wait_for(lambda: serving_worker(daemon)["inflight"] == 1, 30, "the first request handed over")
            sent = time.monotonic()
            raw.send("timed", "decide", BODIES[1], timeout_ms=DEADLINE_MS)     # waits behind it
            late = raw.recv()
            elapsed = time.monotonic() - sent
        held = raw.recv()
    assert (late["id"], code(late)) == ("timed", "deadline_exceeded")
    assert DEADLINE_MS / 1000 <= elapsed < DEADLINE_MS / 1000 + 0.5, elapsed
    assert (held["id"], code(held)) == ("held-timed", "ok")


def test_overloaded_means_the_worker_never_saw_the_request(daemon):
    before = scored(daemon)
    errors_before = daemon.status()["requests"]["by_error_code"].get("overloaded", 0)
    worker = serving_worker(daemon)
    with Raw(daemon.endpoint) as raw:
        with frozen(worker["pid"]):
            raw.send("a", "decide", BODIES[0])
            wait_for(lambda: serving_worker(daemon)["inflight"] == 1, 30, "the first request handed over")
            raw.send("b", "decide", BODIES[1])
            wait_for(lambda: daemon.status()["queue"]["depth"] == 1, 30, "the second request queued")
            raw.send("c", "decide", BODIES[2])                          # the queue (1) is full
            refused = raw.recv()
            assert (refused["id"], code(refused), refused["error"]["retryable"]) == ("c", "overloaded", True)
        replies = {r["id"]: code(r) for r in (raw.recv(), raw.recv())}
    assert replies == {"a": "ok", "b": "ok"}
    assert scored(daemon) == (before[0] + 2, before[1] + 2)        # a and b, never c
    assert daemon.status()["requests"]["by_error_code"]["overloaded"] == errors_before + 1


def test_decide_replies_carry_the_load_the_daemon_had_as_it_replied(daemon):
    worker = serving_worker(daemon)
    with Raw(daemon.endpoint) as raw:
        with frozen(worker["pid"]):
            raw.send("load-a", "decide", BODIES[0])
            wait_for(lambda: serving_worker(daemon)["inflight"] == 1, 30, "the first request handed over")
            raw.send("load-b", "decide", BODIES[1])
            wait_for(lambda: daemon.status()["queue"]["depth"] == 1, 30, "the second request queued")
            raw.send("load-c", "decide", BODIES[2])                          # the queue (1) is full
            refused = raw.recv()
            raw.send("load-p", "ping")
            pong = raw.recv()
        replies = {r["id"]: r for r in (raw.recv(), raw.recv())}
    assert (code(refused), refused["load"]) == ("overloaded", {"queue": 1, "inflight": 1})
    # load-a is answered once load-b has been handed to the worker; load-b when nothing is left
    assert replies["load-a"]["load"] == {"queue": 0, "inflight": 1}
    assert replies["load-b"]["load"] == {"queue": 0, "inflight": 0}
    assert "load" not in pong                                           # decide replies only


def test_a_failed_pass_is_internal_for_its_request_alone_and_the_worker_goes_on(daemon, triggers):
    worker = serving_worker(daemon)
    with daemon.client(timeout=60, retries=0) as client:
        expected = client.call("decide", BODIES[3])
        (triggers / "fail").write_text("")           # the next pass raises inside attention
        with pytest.raises(InternalError, match="scoring failed: RuntimeError: injected scoring failure") as err:
            client.call("decide", BODIES[3])
        assert not err.value.retryable
        assert not (triggers / "fail").exists()      # the fault fired
        assert client.call("decide", BODIES[3])["answers"] == expected["answers"]
    after = serving_worker(daemon)
    assert (after["pid"], after["restarts"]) == (worker["pid"], 0)   # no worker was lost over it
    assert "worker_exit" not in daemon.log.read_text()


def choice_with(n: int) -> dict:
    return {"state": "which one", "questions": {"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(n)}}}}


def test_the_readouts_option_cap_holds_through_the_daemon(daemon):
    with daemon.client(timeout=60, retries=0) as client:
        cap = client.models()["models"][0]["max_options"]
        assert cap == 52                             # the choice readout: labels A-Z, a-z
        answer = client.call("decide", choice_with(cap))["answers"]["q"]
        assert len(answer["probabilities"]) == cap and abs(sum(answer["probabilities"].values()) - 1) <= 1e-6
        with pytest.raises(InvalidRequestError) as err:
            client.call("decide", choice_with(cap + 1))
    words = f"exact choice-token readout supports at most {cap} options"     # JevAny's
    assert err.value.message == f"questions.q: {words} (got {cap + 1})"


def test_log_requests_writes_one_line_per_request_queued_or_refused(daemon):
    # Last: the requests of this module's tests are all answered by now. "c" was refused before it
    # was queued (overloaded) and still gets its line.
    lines = [line.split("event=request ", 1)[1] for line in daemon.log.read_text().splitlines()
             if "event=request " in line]
    for rid, outcome in [("held", "ok"), ("late", "deadline_exceeded"), ("a", "ok"), ("b", "ok"),
                         ("c", "overloaded")]:
        mine = [line.split() for line in lines if line.split()[0] == f"id={rid}"]
        assert len(mine) == 1 and mine[0][1] == f"outcome={outcome}", (rid, lines)
