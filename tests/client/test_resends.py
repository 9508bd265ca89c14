"""What a client sends again when a connection drops while it awaits a reply, seen from the daemon's side.

A fake daemon that never answers a marked request: it keeps the arrival time
and closes the socket the request came in on, then binds it again, so the
connection drops and the client reconnects (fake_daemon.py, "drop"). The
reply can never come, so every call here ends in its timeout; what is
checked is how many times the request reached the daemon: a control op once
(it changes the daemon, so it is never sent twice), a decide once more per
retry and no more (`retries=1`: two arrivals, however often the connection
drops).
"""
import asyncio
import itertools
import os

import pytest

from jevany_client import AsyncJevClient, JevClient, JevTimeoutError, Noul, decide_body

from .conftest import fake_daemon

QUESTIONS = {"ok": Noul()}
# Long enough for a reconnection and a resend (about 0.1-0.3 s), which the checks below must see
# if the client made one; every call waits it out, since the reply can never come.
WAIT_S = 1.5
_keys = itertools.count()


@pytest.fixture(scope="module")
def dropper(socket_dir):
    with fake_daemon(socket_dir, "dropper", control=True) as fake:
        yield fake


def arrivals(fake, key: str) -> int:
    with JevClient(fake.endpoint, timeout=5.0) as client:
        return len(client.status()["arrivals"].get(key, []))


def new_key(what: str) -> str:
    return f"{what}-{os.getpid()}-{next(_keys)}"


@pytest.mark.parametrize("op", ["drain", "reload", "clear_cache"])
def test_a_control_op_whose_connection_drops_is_never_sent_again(dropper, op):
    key = new_key(op)
    with JevClient(dropper.control, timeout=WAIT_S, retries=3) as control:
        with pytest.raises(JevTimeoutError):
            control.call(op, {"record": key, "drop": True})
    assert arrivals(dropper, key) == 1


@pytest.mark.parametrize("retries", [1, 2])
@pytest.mark.parametrize("client", ["JevClient", "AsyncJevClient"])
def test_a_decide_whose_connection_keeps_dropping_goes_again_once_per_retry(dropper, client, retries):
    key = new_key("decide")
    body = decide_body({"record": key, "drop": True}, QUESTIONS)
    if client == "JevClient":
        with JevClient(dropper.endpoint, timeout=WAIT_S, retries=retries) as jc:
            with pytest.raises(JevTimeoutError):
                jc.decide_request(body)
    else:
        async def call():
            async with AsyncJevClient(dropper.endpoint, timeout=WAIT_S, retries=retries) as ajc:
                await ajc.decide_request(body)

        with pytest.raises(JevTimeoutError):
            asyncio.run(asyncio.wait_for(call(), 10 * WAIT_S))
    # Sent, dropped, sent again as often as retries allows (each dropped at once): never once more.
    # (AsyncJevClient once skipped the second resend: the drop came before the first resend's task
    # had returned.)
    assert arrivals(dropper, key) == retries + 1
