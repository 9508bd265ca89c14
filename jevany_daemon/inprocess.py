"""In-process use: load a model once and call it from any number of threads.

The same Engine the daemon's worker runs, so answers match the daemon's.

    model = JevModel.load("runs/my-checkpoint", max_batch_size=8)
    model.decide({"ticket": "..."}, {"urgent": Noul()})

JevAny's JevModel calls work too: from_pretrained (its arguments, its variables
for the rest), model(request) and system_one (JevAny's answer shape), models();
jevany_daemon.asgi serves one over JevAny's HTTP routes.
"""
import os
from dataclasses import asdict
from typing import Any, Mapping

from jevany_client.questions import questions_to_wire

from jevany_daemon.config import EngineConfig, LoadOptions
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model

# JevAny's legacy names of the choice readout's options.
LEGACY = {"letter_temperature": "choice_temperature", "letter_pointer_weight": "choice_native_weight",
          "letter_max_tokens": "choice_max_tokens"}


class JevModel:
    def __init__(self, engine: Engine):
        self.engine = engine

    @property
    def model_id(self) -> str:
        return self.engine.model.model_id

    @classmethod
    def load(cls, source: str, *, readout: str | None = None, device: str = "cpu", dtype: str | None = None,
             model_id: str | None = None, temperature: float | None = None, device_map: str | None = None,
             max_memory_gib: float | None = None, options: LoadOptions | None = None, **settings) -> "JevModel":
        """settings are EngineConfig fields (max_batch_size, max_packed_tokens, layout, ...); options are
        JevAny's load options (None: from its JEVANY_ variables)."""
        config = EngineConfig(**settings)   # fails on a bad setting before any weights load
        model = load_model(source, readout=readout, device=device, dtype=dtype, model_id=model_id,
                           temperature=temperature, device_map=device_map, max_memory_gib=max_memory_gib,
                           options=options)
        return cls(Engine(model, config))

    @classmethod
    def from_settings(cls, s) -> "JevModel":
        """The model a ServeSettings names (server/settings.py resolve), loaded here; one device."""
        if s.model is None:
            raise ValueError("model: name the model to load (JEVANY_MODEL, or a checkpoint)")
        if len(s.devices) > 1 and s.device_map is None:
            raise ValueError(f"device: a model in this process serves one device, got {s.device!r}; "
                             "jevany-daemon serve starts one worker each")
        return cls.load(s.model, readout=s.readout, device=s.device, dtype=s.dtype, model_id=s.model_id,
                        temperature=s.temperature, device_map=s.device_map, max_memory_gib=s.max_memory_gib,
                        options=s.load, **asdict(s.engine))

    @classmethod
    def from_pretrained(cls, checkpoint, *, device: str | None = None, dtype: str | None = None,
                        model_name: str | None = None, readout: str = "native", **choice) -> "JevModel":
        """JevAny's JevModel.from_pretrained: its arguments (choice_temperature, choice_native_weight,
        choice_max_tokens, or their letter_ names), and its variables for the rest (JEVANY_MAX_*_TOKENS,
        JEVANY_PREFIX_*, JEVANY_TEMPERATURE, the load options), checked as `serve` checks them."""
        from jevany_daemon.server.settings import resolve

        unknown = sorted(set(choice) - set(LEGACY) - set(LEGACY.values()))
        if unknown:
            raise TypeError(f"from_pretrained() got unexpected keyword arguments {unknown}")
        for old, new in LEGACY.items():
            if old in choice and new in choice:
                raise ValueError(f"give at most one of {new} and its legacy name {old}")
        options = {LEGACY.get(k, k): v for k, v in choice.items()}
        flags = dict(model=str(checkpoint), device=device, dtype=dtype, model_id=model_name, readout=readout,
                     **options)
        return cls.from_settings(resolve(flags, None, env=os.environ))

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

    def __call__(self, request) -> dict:
        """JevAny's model(request): its request (a dict, or a pydantic model) in, its answer shape out.

        Unknown fields are ignored, as JevAny's request model ignores them; a body it would refuse
        raises pydantic's ValidationError (a ValueError), the daemon's refusals their typed errors.
        """
        from jevany_daemon.gateway.dialects import answer_body
        from jevany_daemon.gateway.shapes import SystemOneRequest

        body = request.model_dump() if hasattr(request, "model_dump") else request
        return answer_body(self.engine.decide(SystemOneRequest.model_validate(body).to_body()), "jevany", additions=False)

    def system_one(self, state: Any, questions: Mapping, *, model: str | None = None,
                   media: list | None = None) -> dict:
        """JevAny's system_one: one request, answered in JevAny's shape."""
        body = {"state": state, "questions": questions_to_wire(questions), "media": media or []}
        return self({**body, **({"model": model} if model is not None else {})})

    def describe(self) -> dict:
        return self.engine.describe()

    def models(self) -> list[dict]:
        """JevAny's models(): this model's /v1/models entry."""
        from jevany_daemon.gateway.embedded import description
        from jevany_daemon.gateway.jevany_view import model_entry

        return [model_entry(description(self))]

    def clear_cache(self) -> int:
        """Drop the kept states (JevAny's clear_cache); how many there were."""
        return self.engine.clear_prefix_cache()
