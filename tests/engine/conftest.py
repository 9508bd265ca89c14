import pytest

from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine


@pytest.fixture
def make_engine(loaded_model):
    def make(arch="qwen3", readout="choice", **settings):
        return Engine(loaded_model(arch, readout), EngineConfig(**settings))
    return make
