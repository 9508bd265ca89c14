"""The routes' far end on a model in this process (gateway/embedded.py), with a stand-in model."""
import asyncio

import pytest

from jevany_client.errors import InvalidRequestError
from jevany_daemon.gateway.embedded import InProcess


class Model:
    def __init__(self):
        self.bodies = []

    def decide_body(self, body):
        self.bodies.append(body)
        return {"answered": body["state"]}


def test_the_model_loads_when_the_app_starts_and_is_starting_until_then():
    loaded = []
    backend = InProcess(load=lambda: loaded.append(1) or Model())
    assert asyncio.run(backend.call("status")) == {"state": "starting"} and loaded == []
    backend.start()
    assert asyncio.run(backend.call("status")) == {"state": "ready"} and loaded == [1]


def test_a_queue_timeout_and_media_are_refused_and_nothing_is_scored():
    model = Model()
    backend = InProcess(model)
    for timeout_ms, body in ((0, {"state": "s"}), (100, {"state": "s"}), (None, {"state": "s", "media": [{}]})):
        with pytest.raises(InvalidRequestError):
            asyncio.run(backend.call("decide", body, timeout_ms=timeout_ms))
    assert model.bodies == []
    assert asyncio.run(backend.call("decide", {"state": "s", "media": []})) == {"answered": "s"}
