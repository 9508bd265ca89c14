import pytest

from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine


@pytest.fixture
def make_engine(loaded_model):
    def make(arch="qwen3", readout="choice", **settings):
        return Engine(loaded_model(arch, readout), EngineConfig(**settings))
    return make


@pytest.fixture(scope="session")
def deep_model(tmp_path_factory):
    """deep_model(arch, readout) -> a DecisionModel of the real models' depth (28 qwen3, 24 qwen3_5 layers)
    at the tiny width, built once per session."""
    cache = {}

    def load(arch="qwen3", readout="choice"):
        if (arch, readout) not in cache:
            from jevany_daemon.model.loading import load_model
            from jevany_daemon.model.tiny import build_tiny_model

            out = tmp_path_factory.mktemp(f"deep-{arch}-{readout}")
            cache[arch, readout] = load_model(str(build_tiny_model(out, arch=arch, readout=readout, shape="deep")),
                                              device="cpu", dtype="fp32")
        return cache[arch, readout]

    return load
