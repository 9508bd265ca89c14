"""Admission: a request validated against the model and its limits, and encoded, before it joins a batch.

Requests handed over together are admitted together: their prompts are
tokenized in one batched call (prompts.py), and each still gets its own
typed error when it breaks a rule.
"""
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from jevany_client.errors import (ContextLengthError, InternalError, InvalidRequestError, JevanyError,
                                  UnknownModelError, UnsupportedMediaError)
from jevany_client.schema import DecisionRequest, parse_decision

from .date_facts import TooLong, with_date_facts
from .prompts import Encoded, Failed

LATEST_ALIAS = "jevany-latest"
# The names TypeSafe's clients send for the current model (typesafe-sdk's default, and its box example's):
# a caller pointed here unchanged gets this deployment, as it does from any Jev API server.
JEV_ALIASES = ("jev-latest", "jev-preview")
MAX_MEDIA_QUESTIONS = 1     # JevAny's: a media request is scored alone, with one question
# JevAny's words for a question with more options than the readout reads.
OPTION_CAP = {"choice": "exact choice-token readout supports at most {n} options",
              "lm_token": "lm-token mode supports at most {n} options per question",
              "pointer": "the pointer readout supports at most {n} options per question"}


@dataclass(eq=False)
class Admitted:
    """A validated, encoded request, ready to join a batch."""
    request: DecisionRequest
    encoded: Encoded
    origin: str | None = None     # where the caller came from (the daemon: zmq or http); opaque here
    native: Encoded | None = None  # its native-readout encoding, when the choice readout blends one in
    tenant: str | None = None     # whose prefix-cache entries it may share (the daemon's salt); opaque here
    costed: tuple | None = field(default=None, repr=False)   # (cache generation, cost): Engine.cost's memo


class Admission:
    """Checks requests against the model, its limits and the readout's, and encodes them.

    It owns the tokenizer lock: whoever else uses the model's tokenizer (a
    media pass, usage counts) is handed this lock (passes.py).
    """

    def __init__(self, *, model, encoder, blend, layout, limits, max_options: int, max_packed_tokens: int,
                 date_facts: bool):
        self.model, self.encoder, self.blend, self.layout, self.limits = model, encoder, blend, layout, limits
        self.max_options, self.max_packed_tokens, self.date_facts = max_options, max_packed_tokens, date_facts
        self.tokenizer_lock = threading.Lock()   # fast tokenizers are not safe to share across threads

    def admit_many(self, bodies: list[Any], origins: list[str | None],
                   tenants: list[str | None]) -> list[Admitted | JevanyError]:
        """Each body admitted, or the typed error it gets; one batched tokenization for them all."""
        requests: list[DecisionRequest | JevanyError] = []
        for body in bodies:
            try:
                requests.append(self._check(body))
            except JevanyError as exc:
                requests.append(exc)
        ok = [r for r in requests if isinstance(r, DecisionRequest)]
        with self.tokenizer_lock:
            encoded = iter(_encode_all(self.encoder, ok, self.limits))
            native = iter(_encode_all(self.blend.encoder, ok, self.limits) if self.blend else [None] * len(ok))
        out = []
        for request, origin, tenant in zip(requests, origins, tenants):
            if isinstance(request, JevanyError):
                out.append(request)
                continue
            try:
                out.append(self._admitted(request, next(encoded), next(native), origin, tenant))
            except JevanyError as exc:
                out.append(exc)
        return out

    def _admitted(self, request: DecisionRequest, encoded, native, origin, tenant) -> Admitted:
        for enc in (encoded, native):
            if isinstance(enc, Failed):
                raise enc.error
        if tenant is not None:    # the prefix cache keys its entries by it (prefix_cache.py)
            encoded = replace(encoded, tenant=tenant)
        # The configured layout's cost, cached or not: a request is admitted or refused
        # the same whatever the cache holds at the moment. A blended request runs two
        # passes, each of which must fit.
        budget = self.max_packed_tokens
        for enc in [e for e in (encoded, native) if e is not None]:
            shape = self.layout.shape(enc)
            cost = shape.rows * shape.width + shape.prefix
            if cost > budget:
                raise ContextLengthError(f"request exceeds {budget} packed tokens: {cost}")
        return Admitted(request, encoded, origin, native=native, tenant=tenant)

    def _check(self, body: Any) -> DecisionRequest:
        """Validate; raises the typed error the caller should get."""
        try:
            request = body if isinstance(body, DecisionRequest) else parse_decision(body)
        except JevanyError:
            raise
        except Exception as exc:   # noqa: BLE001 - a body the schema could not even read
            raise InternalError(f"admission failed: {type(exc).__name__}: {exc}") from None
        self._check_model(request)
        if request.media:
            self._check_media(request)
        for q in request.questions:
            if q.n_options > self.max_options:
                words = OPTION_CAP[self.model.readout].format(n=self.max_options)
                raise InvalidRequestError(f"questions.{q.qid}: {words} (got {q.n_options})")
        if self.date_facts:
            request = replace(request, state=self._with_date_facts(request.state))
        return request

    def _with_date_facts(self, state: Any) -> Any:
        # Facts grow with the square of the dates: stop building them once the state
        # could no longer fit its token limit, as the encoder would refuse it anyway.
        per_token, limit = self.encoder.per_token, self.limits.state
        try:
            return with_date_facts(state, max_chars=limit * per_token)
        except TooLong as exc:
            raise ContextLengthError(f"state exceeds {limit} tokens: at least "
                                     f"{-(-exc.chars // per_token)} with its date facts") from None

    def _check_media(self, request: DecisionRequest) -> None:
        """JevAny's order: the model takes media at all, each type, then one question per request."""
        model = self.model
        if not model.multimodal and model.readout == "choice":
            raise UnsupportedMediaError("choice readout does not support media requests")
        served = getattr(model, "media_types", ())
        for item in request.media:
            if item.type not in served:
                why = model.info.get("media_unavailable")
                raise UnsupportedMediaError("checkpoint does not support the requested media type"
                                            + (f" ({item.type}: {why})" if why else ""))
        if len(request.questions) > MAX_MEDIA_QUESTIONS:
            raise InvalidRequestError(f"media requests support at most {MAX_MEDIA_QUESTIONS} question(s)")
        if self.blend is not None:
            # The native pass reads its own prompt through the text layouts; it would drop the media.
            raise UnsupportedMediaError("the choice readout's native blend (choice_native_weight) takes text only")

    def _check_model(self, request: DecisionRequest) -> None:
        model = self.model
        if request.model not in (None, model.model_id, LATEST_ALIAS, *JEV_ALIASES):
            raise UnknownModelError(
                f"unknown model {request.model!r}; this deployment serves {model.model_id!r}"
            )


def _encode_all(encoder, requests: list[DecisionRequest], limits) -> list:
    """encoder.encode_many; should it fail as a whole, each request alone, so a fault stays with its cause."""
    try:
        return encoder.encode_many(requests, limits)
    except Exception:   # noqa: BLE001 - narrowed down request by request below
        out = []
        for request in requests:
            try:
                out.extend(encoder.encode_many([request], limits))
            except Exception as exc:   # noqa: BLE001 - becomes this request's internal error
                out.append(Failed(InternalError(f"admission failed: {type(exc).__name__}: {exc}")))
        return out
