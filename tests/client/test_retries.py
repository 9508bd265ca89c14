"""Retries of retryable errors, and the CurveZMQ key arguments (against the fake daemon)."""
import asyncio
import os
import random
import time

import pytest
import zmq

from jevany_client import (AsyncJevClient, InvalidRequestError, JevanyError, JevClient, OverloadedError,
                           ShuttingDownError)
from jevany_client.questions import Noul

QUESTIONS = {"ok": Noul()}
TIMEOUT_S = 0.4


def errors(daemon, code: str) -> int:
    with JevClient(daemon.endpoint, timeout=5.0) as c:
        return c.status()["requests"]["by_error_code"].get(code, 0)


@pytest.mark.parametrize("retries", [0, 2])
def test_retryable_errors_are_tried_again_up_to_the_bound(daemon, retries):
    before = errors(daemon, "overloaded")
    with JevClient(daemon.endpoint, timeout=5.0, retries=retries) as client:
        with pytest.raises(OverloadedError):
            client.decide("error:overloaded", QUESTIONS)
    assert errors(daemon, "overloaded") - before == retries + 1


def test_decide_many_retries_only_the_failed_ones_and_keeps_order(daemon):
    from jevany_client.client import decide_body

    bodies = [decide_body("fine", QUESTIONS), decide_body("error:shutting_down", QUESTIONS)]
    before = errors(daemon, "shutting_down")
    with JevClient(daemon.endpoint, timeout=5.0, retries=3) as client:
        fine, failed = client.decide_many(bodies, return_exceptions=True)
    assert fine["state"] == "fine" and isinstance(failed, ShuttingDownError)
    assert errors(daemon, "shutting_down") - before == 4


def test_errors_that_are_not_retryable_are_not_retried(daemon):
    before = errors(daemon, "invalid_request")
    with JevClient(daemon.endpoint, timeout=5.0, retries=5) as client:
        with pytest.raises(InvalidRequestError):
            client.decide("error:invalid_request", QUESTIONS)
    assert errors(daemon, "invalid_request") - before == 1


def timed_failure(client: str, endpoint: str, body: dict) -> tuple[JevanyError, float]:
    """(the error a decide of body ends in, its seconds), on a client already connected."""
    if client == "JevClient":
        with JevClient(endpoint, timeout=TIMEOUT_S, retries=1000) as jc:
            jc.ping(timeout=10.0)           # connected: what is timed is the tries alone
            started = time.monotonic()
            with pytest.raises(JevanyError) as err:
                jc.decide(body, QUESTIONS)
            return err.value, time.monotonic() - started

    async def call():
        async with AsyncJevClient(endpoint, timeout=TIMEOUT_S, retries=1000) as ajc:
            await ajc.ping(timeout=10.0)
            started = time.monotonic()
            with pytest.raises(JevanyError) as err:
                await ajc.decide(body, QUESTIONS)
            return err.value, time.monotonic() - started
    return asyncio.run(call())


@pytest.mark.parametrize("client", ["JevClient", "AsyncJevClient"])
def test_retries_stay_within_the_call_timeout(daemon, monkeypatch, client):
    """A pause that would end past the call's timeout is not taken: the call ends within its timeout.

    The jitter is fixed at 0.8, so the pauses are 40, 80, 160, 320 ms...: the fourth try goes near
    0.29 s, and the 320 ms pause after it would end past the 0.4 s timeout, so the call ends there.
    One that took that pause anyway would end after 0.6 s; the bound leaves 0.15 s for a busy machine.
    """
    monkeypatch.setattr(random, "uniform", lambda low, high: 0.8)
    key = f"within-{client}-{os.getpid()}"
    error, elapsed = timed_failure(client, daemon.endpoint, {"record": key, "error": "overloaded"})
    # overloaded, or a timeout where a busy machine made the last reply come too late
    assert error.code in ("overloaded", "timeout")
    assert elapsed < TIMEOUT_S + 0.15, elapsed
    with JevClient(daemon.endpoint, timeout=5.0) as c:
        assert len(c.status()["arrivals"][key]) >= 2        # it did try again


def test_bad_retries_are_refused():
    for retries in (-1, 1.5, True):
        with pytest.raises(ValueError, match="retries"):
            JevClient("ipc:///nowhere", retries=retries)


def test_curve_key_arguments(tmp_path):
    public, secret = (k.decode() for k in zmq.curve_keypair())
    server_public, _ = zmq.curve_keypair()
    client = JevClient("tcp://127.0.0.1:1", server_public_key=server_public,
                       client_public_key=public, client_secret_key=secret)
    assert client._curve == (server_public, public.encode(), secret.encode())
    key_file = tmp_path / "me.key_secret"
    key_file.write_text(f'curve\n    public-key = "{public}"\n    secret-key = "{secret}"\n')
    server_file = tmp_path / "server.key"
    server_file.write_text(f'curve\n    public-key = "{server_public.decode()}"\n')
    from_files = JevClient(
        "tcp://127.0.0.1:1", server_public_key=server_file, client_secret_key_file=key_file
    )
    assert from_files._curve == client._curve
    for kw, message in [
        ({"server_public_key": server_public}, "needs the client's own key pair"),
        ({"client_secret_key_file": key_file}, "need server_public_key"),
        ({"server_public_key": "too-short", "client_secret_key_file": key_file}, "cannot read"),
        ({"server_public_key": server_public, "client_secret_key_file": server_file},
         "holds no secret key"),
    ]:
        with pytest.raises(ValueError, match=message):
            JevClient("tcp://127.0.0.1:1", **kw)
