"""In-process use: load a model once and call it from any number of threads.

The same Engine the daemon's worker runs, so answers match the daemon's.

    model = JevModel.load("runs/my-checkpoint", max_batch_size=8)
    model.decide({"ticket": "..."}, {"urgent": Noul()})
"""
from typing import Any, Mapping

from jevany_client.questions import questions_to_wire

from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model


class JevModel:
    def __init__(self, engine: Engine):
        self.engine = engine

    @classmethod
    def load(cls, source: str, *, readout: str | None = None, device: str = "cpu", dtype: str = "fp32",
             model_id: str | None = None, temperature: float | None = None, **settings) -> "JevModel":
        """settings are EngineConfig fields (max_batch_size, max_packed_tokens, layout, ...)."""
        config = EngineConfig(**settings)   # fails on a bad setting before any weights load
        model = load_model(source, readout=readout, device=device, dtype=dtype,
                           model_id=model_id, temperature=temperature)
        return cls(Engine(model, config))

    def decide(self, state: Any, questions: Mapping, model: str | None = None, media: list | None = None) -> dict:
        """Score one request; raises the typed jevany_client error a daemon client would get."""
        body = {"state": state, "questions": questions_to_wire(questions)}
        if model is not None:
            body["model"] = model
        if media is not None:
            body["media"] = media
        return self.engine.decide(body)

    def decide_body(self, body: dict) -> dict:
        """Score a wire-format decide body as-is."""
        return self.engine.decide(body)

    def describe(self) -> dict:
        return self.engine.describe()
