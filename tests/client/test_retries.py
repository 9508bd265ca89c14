"""Retries of retryable errors, and the CurveZMQ key arguments (against the fake daemon)."""
import time

import pytest
import zmq

from jevany_client import InvalidRequestError, JevClient, OverloadedError, ShuttingDownError
from jevany_client.questions import Noul

QUESTIONS = {"ok": Noul()}


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


def test_retries_stay_within_the_call_timeout(daemon):
    started = time.monotonic()
    with JevClient(daemon.endpoint, timeout=0.4, retries=1000) as client:
        with pytest.raises(OverloadedError):
            client.decide("error:overloaded", QUESTIONS)
    assert time.monotonic() - started < 2


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
