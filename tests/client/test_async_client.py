"""AsyncJevClient against fake daemons (and one real tiny daemon): concurrency, errors, retries,
timeouts, cancellation and close.

Each test runs its own event loop under a bound, so a hang fails instead of stalling the suite.
"""
import asyncio
import itertools
import multiprocessing
import os
import subprocess
import sys

import pytest

from jevany_client import (
    ERROR_CLASSES,
    AsyncJevClient,
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

from .conftest import fake_daemon

QUESTIONS = {"pick": Choice(["red", "blue"]), "ok": Noul()}
WITHIN_S = 60.0          # a bound on each test's loop, not a speed check
_groups = itertools.count()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, WITHIN_S))


def new_group(name: str) -> str:
    # The fake daemon is shared by the session: a held group must never be met twice.
    return f"{name}-{os.getpid()}-{next(_groups)}"


async def until_held(client: AsyncJevClient, group: str, count: int) -> None:
    """Wait until the daemon holds `count` requests of `group`: they were sent and arrived."""
    while (await client.status())["held"].get(group, 0) < count:
        await asyncio.sleep(0.02)     # polling an observable condition, not standing in for a reply


def errors(daemon, code: str) -> int:
    with JevClient(daemon.endpoint, timeout=5.0) as c:
        return c.status()["requests"]["by_error_code"].get(code, 0)


def test_many_concurrent_decides_over_one_socket_each_get_their_own_answer(daemon):
    """The daemon answers only once all of them are in, newest first: each must still get its own."""
    group, n = new_group("many"), 40

    async def main():
        async with AsyncJevClient(daemon.endpoint, timeout=30.0) as client:
            states = [{"group": group, "size": n, "i": i, "text": f"item {i}"} for i in range(n)]
            questions = [{f"q{i}": Noul(instructions=f"question {i}")} for i in range(n)]
            results = await asyncio.gather(*(client.decide(s, q) for s, q in zip(states, questions)))
            return states, questions, results, client.discarded

    states, questions, results, discarded = run(main())
    for state, asked, result in zip(states, questions, results):
        assert result["state"] == state
        assert result["questions"] == decide_body(state, asked)["questions"]
    assert len({r["peer"] for r in results}) == 1          # one socket carried them all
    orders = [r["order"] for r in results]
    assert orders == sorted(orders, reverse=True)           # answered in the reverse of sending order
    assert discarded == 0


def test_decide_request_and_decide_many_take_prepared_bodies(daemon):
    typed = {"state": "typed", "questions": {"pick": Choice(["red", "blue"]), "ok": {"type": "noul"}}}

    async def main():
        async with AsyncJevClient(daemon.endpoint, timeout=10.0) as client:
            one = await client.decide_request(typed)
            many = await client.decide_many([decide_body("a", QUESTIONS), typed,
                                             decide_body("error:internal", QUESTIONS)],
                                            return_exceptions=True)
            with pytest.raises(OverloadedError):
                await client.decide_many([decide_body("b", QUESTIONS), decide_body("error:overloaded", QUESTIONS)])
            return one, many

    one, (a, again, failed) = run(main())
    with JevClient(daemon.endpoint, timeout=10.0) as sync_client:
        sync_one = sync_client.decide_request(typed)          # JevClient takes a prepared body too
    wire = {"pick": {"type": "choice", "criteria": {"red": None, "blue": None}}, "ok": {"type": "noul"}}
    assert (one["state"], one["questions"]) == (sync_one["state"], sync_one["questions"]) == ("typed", wire)
    assert typed["questions"]["pick"] == Choice(["red", "blue"])     # the caller's body is left as it was
    assert (a["state"], again["state"]) == ("a", "typed")
    assert type(failed).__name__ == "InternalError"


@pytest.mark.parametrize("code", [*sorted(ERROR_CLASSES), "rate_limited"])
def test_error_replies_raise_the_same_class_as_jevclient(daemon, code):
    with JevClient(daemon.endpoint, timeout=5.0, retries=0) as sync_client:
        with pytest.raises(JevanyError) as sync_caught:
            sync_client.decide(f"error:{code}", QUESTIONS)

    async def main():
        async with AsyncJevClient(daemon.endpoint, timeout=5.0, retries=0) as client:
            with pytest.raises(JevanyError) as caught:
                await client.decide(f"error:{code}", QUESTIONS)
            return caught.value

    err, expected = run(main()), sync_caught.value
    assert type(err) is type(expected) is ERROR_CLASSES.get(code, JevanyError)
    assert (err.code, err.message, err.retryable) == (expected.code, expected.message, expected.retryable)
    assert isinstance(err.request_id, str)


def test_timeout_leaves_the_client_usable_and_discards_the_late_reply(daemon):
    async def main():
        async with AsyncJevClient(daemon.endpoint, timeout=10.0) as client:
            await client.ping()       # connected, so the request below is sent before its time is up
            with pytest.raises(JevTimeoutError) as caught:
                await client.decide({"delay": 0.5, "tag": "first"}, QUESTIONS, timeout=0.1)
            # Due after the first one's late reply, so that reply reaches the client first.
            second = await client.decide({"delay": 0.5, "tag": "second"}, QUESTIONS)
            return caught.value, second, client.discarded

    err, second, discarded = run(main())
    assert (err.code, err.sent) == ("timeout", True) and isinstance(err, TimeoutError)
    assert err.message == f"no reply to decide from {daemon.endpoint} within 0.1s"
    assert second["state"] == {"delay": 0.5, "tag": "second"}
    assert discarded == 1


def test_no_socket_file_fails_at_once_and_a_dead_one_times_out_unsent(nowhere, stale):
    async def main():
        async with AsyncJevClient(nowhere, timeout=None) as gone, AsyncJevClient(stale, timeout=0.3) as dead:
            with pytest.raises(JevUnreachableError) as unreachable:
                await gone.ping()      # no timeout at all: only the missing file can end this call
            with pytest.raises(JevTimeoutError) as timed_out:
                await dead.decide("s", QUESTIONS)
            return unreachable.value, timed_out.value

    unreachable, timed_out = run(main())
    assert unreachable.sent is False and "no socket file there" in unreachable.message
    assert timed_out.sent is False
    assert timed_out.message == f"daemon not reachable at {stale} within 0.3s; the decide request was not sent"


def test_a_message_over_the_daemons_limit_is_refused_naming_it(daemon):
    async def main():
        async with AsyncJevClient(daemon.endpoint, timeout=None) as client:
            with pytest.raises(InvalidRequestError) as caught:
                await client.decide("x" * (2 << 20), QUESTIONS)    # no timeout: a dropped message would hang
            return caught.value, await client.decide("y" * (200 << 10), QUESTIONS)

    err, large = run(main())
    assert "accepts at most 1,048,576 (its --max-message-bytes" in err.message
    assert large["state"] == "y" * (200 << 10)


@pytest.mark.parametrize("retries", [0, 2])
def test_retryable_errors_are_tried_again_up_to_the_bound(daemon, retries):
    before = errors(daemon, "overloaded")

    async def main():
        async with AsyncJevClient(daemon.endpoint, timeout=10.0, retries=retries) as client:
            with pytest.raises(OverloadedError):
                await client.decide("error:overloaded", QUESTIONS)

    run(main())
    assert errors(daemon, "overloaded") - before == retries + 1


def test_errors_that_are_not_retryable_are_sent_once(daemon):
    before = errors(daemon, "invalid_request")

    async def main():
        async with AsyncJevClient(daemon.endpoint, timeout=10.0, retries=5) as client:
            with pytest.raises(InvalidRequestError):
                await client.decide("error:invalid_request", QUESTIONS)

    run(main())
    assert errors(daemon, "invalid_request") - before == 1


def test_control_ops_are_never_retried(daemon):
    """A control op changes the daemon: even a retryable error is not sent again."""
    before = errors(daemon, "overloaded")

    async def main():
        async with AsyncJevClient(daemon.control, timeout=10.0, retries=3) as control:
            with pytest.raises(OverloadedError):
                await control.call("drain", {"error": "overloaded"})
            return (await control.drain())["op"]

    assert run(main()) == "drain"
    assert errors(daemon, "overloaded") - before == 1


def test_a_cancelled_calls_late_reply_is_discarded_never_delivered(daemon):
    """The held-back reply arrives first, right before the next call's own: it must be dropped."""
    group = new_group("cancel")
    held = {"group": group, "size": 2, "oldest_first": True}

    async def main():
        async with AsyncJevClient(daemon.endpoint, timeout=30.0) as client:
            cancelled = asyncio.ensure_future(client.decide({**held, "tag": "cancelled"}, QUESTIONS))
            await until_held(client, group, 1)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            assert client.discarded == 0
            following = await client.decide({**held, "tag": "next"}, QUESTIONS)
            return following, client.discarded, await client.ping()

    following, discarded, pong = run(main())
    assert following["state"]["tag"] == "next"
    assert discarded == 1
    assert pong["pong"] is True


def test_a_duplicate_reply_is_discarded_never_delivered(daemon):
    """The daemon answers twice; the second copy comes before the next call's own reply."""
    async def main():
        async with AsyncJevClient(daemon.endpoint, timeout=10.0) as client:
            first = await client.decide({"duplicate_after": 0, "tag": "twice"}, QUESTIONS)
            following = await client.decide({"tag": "next"}, QUESTIONS)
            return first, following, client.discarded

    first, following, discarded = run(main())
    assert first["state"]["tag"] == "twice" and following["state"]["tag"] == "next"
    assert discarded == 1


def test_close_fails_pending_calls_at_once_and_refuses_new_ones(daemon, stale):
    group = new_group("close")

    async def main():
        client = AsyncJevClient(daemon.endpoint, timeout=None)     # nothing but close can end these
        unsent = AsyncJevClient(stale, timeout=None)               # this one's send can never complete
        pending = [asyncio.ensure_future(client.decide({"group": group, "size": 100, "i": i}, QUESTIONS))
                   for i in range(3)]
        sending = asyncio.ensure_future(unsent.decide("s", QUESTIONS))
        await until_held(client, group, 3)    # by now the unsent call waits in its send, too
        await client.close()
        await unsent.close()
        outcomes = await asyncio.gather(*pending, sending, return_exceptions=True)
        with pytest.raises(RuntimeError, match="closed"):
            await client.ping()
        await client.close()            # twice is harmless
        return outcomes

    outcomes = run(main())
    assert [type(o) for o in outcomes] == [RuntimeError] * 4
    assert all(str(o) == "this AsyncJevClient is closed" for o in outcomes)


def test_a_client_belongs_to_its_first_event_loop(daemon):
    client = AsyncJevClient(daemon.endpoint, timeout=5.0)
    assert asyncio.run(client.ping())["pong"] is True
    with pytest.raises(RuntimeError, match="one AsyncJevClient per loop"):
        asyncio.run(client.ping())
    asyncio.run(client.close())


def _child_decides(client, queue):
    try:
        state = f"child-{os.getpid()}"
        result = asyncio.run(client.decide(state, QUESTIONS))
        queue.put((result["state"] == state, result["peer"]))
    except BaseException as exc:  # report, do not hang the parent
        queue.put(repr(exc))


def test_a_forked_child_opens_its_own_socket(daemon):
    client = AsyncJevClient(daemon.endpoint, timeout=10.0)
    parent_peer = asyncio.run(client.decide("parent", QUESTIONS))["peer"]
    fork = multiprocessing.get_context("fork")
    queue = fork.SimpleQueue()
    child = fork.Process(target=_child_decides, args=(client, queue))
    child.start()
    try:
        child.join(timeout=30)
        assert child.exitcode == 0
        answered, child_peer = queue.get()
    finally:
        if child.is_alive():
            child.kill()
            child.join(timeout=5)
    assert answered is True and child_peer != parent_peer
    asyncio.run(client.close())


def test_a_request_lost_with_its_daemon_is_sent_again_on_reconnect(socket_dir):
    """The daemon holding a request is killed and comes back at the same endpoint: the request
    goes again (same id) and is answered; the client never saw a reply for it."""
    group = new_group("resend")
    held = {"group": group, "size": 2, "oldest_first": True}

    async def main(fake):
        async with AsyncJevClient(fake.endpoint, timeout=30.0, retries=2) as client:
            lost = asyncio.ensure_future(client.decide({**held, "tag": "lost"}, QUESTIONS))
            await until_held(client, group, 1)
            fake.process.kill()
            fake.process.wait(timeout=10)
            with fake_daemon(socket_dir, "gamma") as again:
                await until_held(client, group, 1)      # the resend reached the new daemon
                following = await client.decide({**held, "tag": "next"}, QUESTIONS)
                return await lost, following, again.process.pid

    with fake_daemon(socket_dir, "gamma") as first:
        lost, following, pid = run(main(first))
    assert lost["state"]["tag"] == "lost" and following["state"]["tag"] == "next"
    assert lost["pid"] == pid != first.process.pid


@pytest.mark.parametrize("bad", [{"timeout": 0}, {"timeout": float("inf")}, {"retries": -1}, {"retries": True},
                                 {"endpoint": []}])
def test_bad_options_are_refused_as_jevclient_refuses_them(bad):
    options = {"endpoint": "ipc:///nowhere", **bad}
    with pytest.raises(ValueError) as sync_refusal:
        JevClient(**options)
    with pytest.raises(ValueError) as refusal:
        AsyncJevClient(**options)
    assert str(refusal.value) == str(sync_refusal.value)


def test_answers_match_jevclient_on_a_real_daemon(tiny_model):
    """Real batching, real answers: concurrent calls each get the answer to their own question."""
    import shutil
    import tempfile
    from pathlib import Path

    from tests.server.daemons import Daemon

    directory = Path(tempfile.mkdtemp(prefix="jva-"))
    daemon = Daemon(directory, tiny_model("qwen3", "choice"))
    try:
        daemon.wait_ready()
        bodies = [decide_body({"ticket": f"parcel {i} is late", "day": i},
                              {f"q{i}": Choice(["refund", "resend", "wait"][: 2 + i % 2])})
                  for i in range(12)]
        with JevClient(daemon.endpoint, timeout=60.0) as sync_client:
            expected = [sync_client.decide_many([body])[0] for body in bodies]

        async def main():
            async with AsyncJevClient(daemon.endpoint, timeout=60.0) as client:
                return await asyncio.gather(*(client.decide_request(body) for body in bodies))

        results = run(main())
    finally:
        daemon.proc.kill()
        daemon.proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)
    for i, (result, alone) in enumerate(zip(results, expected)):
        [(qid, answer)] = result["answers"].items()
        assert qid == f"q{i}" and answer["choice"] == alone["answers"][qid]["choice"]
        assert answer["probabilities"] == pytest.approx(alone["answers"][qid]["probabilities"], abs=1e-4)


def test_importing_the_async_client_pulls_in_no_model_stack():
    code = ("import sys\n"
            "from jevany_client import AsyncJevClient\n"
            "assert 'zmq.asyncio' in sys.modules\n"
            "print(','.join(m for m in ('torch', 'transformers', 'typer', 'numpy') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == ""
