"""The decision engine: admit → take a batch → score → shape answers. No sockets.

The same object serves in-process callers (``decide`` from any number of
threads, batched by group commit) and the daemon's worker (``score`` on a
list of requests the supervisor handed over at once).
"""
import json
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from jevany_client.answers import shape_answer, validate_answer
from jevany_client.errors import (
    InternalError,
    InvalidRequestError,
    JevanyError,
    UnknownModelError,
    UnsupportedMediaError,
    ContextLengthError,
)
from jevany_client.schema import DecisionRequest, parse_decision

from jevany_daemon.config import EngineConfig, default_padding_waste
from jevany_daemon.model.decision_model import DecisionModel

from .batching import BatchLimits, GroupCommit, Pending, drain, take_batch
from .date_facts import TooLong, with_date_facts
from .faults import (DeviceLost, NonFiniteError, check_finite, is_device_lost, is_out_of_memory,
                     release_cached_memory)
from .layouts import PACKED_PROVEN, SHARED_PROVEN, PackedLayout, RowsLayout, Shape, SharedLayout
from .masks import per_layer_type
from .media_pass import media_forward
from .native_blend import both_passes, native_blend
from .policy import BatchPolicy
from .prefix_cache import PrefixCache
from .prefix_reuse import OnePass, TwoPass
from .prompts import Encoded, Limits, make_encoder
from .readouts import make_readout

LATEST_ALIAS = "jevany-latest"
MAX_MEDIA_QUESTIONS = 1     # JevAny's: a media request is scored alone, with one question
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(eq=False)
class Admitted:
    """A validated, encoded request, ready to join a batch."""
    request: DecisionRequest
    encoded: Encoded
    origin: str | None = None     # where the caller came from (the daemon: zmq or http); opaque here
    native: Encoded | None = None  # its native-readout encoding, when the choice readout blends one in
    tenant: str | None = None     # whose prefix-cache entries it may share (the daemon's salt); opaque here


@dataclass(frozen=True)
class BatchRecord:
    """One forward pass, as observers and statistics see it."""
    size: int
    padded_tokens: int
    real_tokens: int
    latency_ms: float
    ok: bool
    origins: tuple = ()           # the distinct origins of its requests, sorted


@dataclass
class BatchStats:
    batches: int = 0
    requests: int = 0
    padded_tokens: int = 0
    real_tokens: int = 0
    retried_alone: int = 0
    non_finite: int = 0      # passes whose probabilities were not all finite (failed, then retried alone)
    busy_s: float = 0.0      # time spent in forward passes; over wall time, how saturated the model is
    histogram: Counter = field(default_factory=Counter)

    def record(self, rec: BatchRecord) -> None:
        self.batches += 1
        self.requests += rec.size
        self.padded_tokens += rec.padded_tokens
        self.real_tokens += rec.real_tokens
        self.busy_s += rec.latency_ms / 1000
        self.histogram[rec.size] += 1

    def as_dict(self) -> dict:
        return {
            "batches": self.batches,
            "requests": self.requests,
            "mean_batch_size": self.requests / self.batches if self.batches else 0.0,
            "batch_size_histogram": {str(k): v for k, v in sorted(self.histogram.items())},
            "padded_tokens": self.padded_tokens,
            "padding_waste": 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0,
            "retried_alone": self.retried_alone,
            "non_finite": self.non_finite,
            "busy_s": round(self.busy_s, 4),
        }


def choose_layout(model: DecisionModel, wanted: str):
    """auto: packed where proven, else shared where proven (hybrid models), else rows."""
    packable = model.model_type in PACKED_PROVEN and not model.hybrid
    shareable = model.model_type in SHARED_PROVEN
    if wanted == "packed" and not packable:
        raise ValueError(
            f"packed layout is not proven for {model.model_type}"
            f"{' (hybrid recurrent layers)' if model.hybrid else ''}; use rows or shared"
        )
    if wanted == "shared" and not shareable:
        raise ValueError(f"shared layout is not proven for {model.model_type}; use rows")
    if wanted == "rows":
        return RowsLayout()
    if wanted == "packed" or (wanted == "auto" and packable):
        return PackedLayout()
    if shareable:
        return SharedLayout()
    return RowsLayout()


class Engine:
    def __init__(
        self,
        model: DecisionModel,
        config: EngineConfig = EngineConfig(),
        observer: Callable[[BatchRecord], None] | None = None,
    ):
        self.model, self.config, self.observer = model, config, observer
        self.layout = choose_layout(model, config.layout)
        self.readout = make_readout(model, config.choice_temperature)
        self.encoder = make_encoder(model)
        self.blend = native_blend(model, config.choice_native_weight)
        self.max_options = self.readout.max_options
        if self.blend is not None:
            self.max_options = min(self.max_options, self.blend.readout.max_options)
        # With a prefix cache, every request without media continues from the longest
        # prefix the cache holds (prefix_reuse.py); the configured layout serves the rest.
        self.memory, self._reuse = None, None
        if config.prefix_cache > 0 and model.model_type in SHARED_PROVEN:
            self.memory = PrefixCache(config.prefix_cache, config.prefix_cache_bytes, config.prefix_min_tokens)
            reuse = OnePass if model.model_type in PACKED_PROVEN and not model.hybrid else TwoPass
            self._reuse = reuse(self.memory, getattr(self.encoder, "head", ()))
        window = model.context_window
        self.limits = Limits(min(config.max_state_tokens, window), min(config.max_branch_tokens, window), window,
                             min(config.choice_max_tokens, window))
        waste = config.max_padding_waste
        if waste is None:
            waste = default_padding_waste(model.device.type)
        self.batch_limits = BatchLimits(config.max_batch_size, config.max_packed_tokens, waste)
        self.alone_limits = replace(self.batch_limits, max_size=1)
        self.reset_statistics()
        self.pad_id = _pad_id(model.tokenizer)
        self._tokenizer_lock = threading.Lock()   # fast tokenizers are not safe to share across threads
        self._commit = GroupCommit(self._take, self._run_pending)
        self.lost: DeviceLost | None = None    # set once the device failed beyond recovery

    # --- admit -----------------------------------------------------------

    def admit(self, body: Any, origin: str | None = None, tenant: str | None = None) -> Admitted:
        """Validate and encode; raises the typed error the caller should get.

        tenant: an opaque salt; requests of different tenants never share prefix-cache entries.
        """
        request = body if isinstance(body, DecisionRequest) else parse_decision(body)
        self._check_model(request)
        if request.media:
            self._check_media(request)
        for q in request.questions:
            if q.n_options > self.max_options:
                raise InvalidRequestError(
                    f"questions.{q.qid}: the {self.model.readout} readout supports at most "
                    f"{self.max_options} options, got {q.n_options}"
                )
        if self.config.date_facts:
            request = replace(request, state=self._with_date_facts(request.state))
        with self._tokenizer_lock:
            encoded = self.encoder.encode(request, self.limits)
            native = None if self.blend is None else self.blend.encoder.encode(request, self.limits)
        # The configured layout's cost, cached or not: a request is admitted or refused
        # the same whatever the cache holds at the moment. A blended request runs two
        # passes, each of which must fit.
        for enc in [e for e in (encoded, native) if e is not None]:
            shape = self.layout.shape(enc)
            cost = shape.rows * shape.width + shape.prefix
            if cost > self.config.max_packed_tokens:
                raise ContextLengthError(f"request exceeds {self.config.max_packed_tokens} packed tokens: {cost}")
        return Admitted(request, encoded, origin, native=native, tenant=tenant)

    def _with_date_facts(self, state: Any) -> Any:
        # Facts grow with the square of the dates: stop building them once the state
        # could no longer fit its token limit, as the encoder would refuse it anyway.
        per_token = self.encoder.per_token
        try:
            return with_date_facts(state, max_chars=self.limits.state * per_token)
        except TooLong as exc:
            raise ContextLengthError(f"state exceeds {self.limits.state} tokens: at least "
                                     f"{-(-exc.chars // per_token)} with its date facts") from None

    def _check_media(self, request: DecisionRequest) -> None:
        """JevAny's order: the model takes media at all, each type, then one question per request."""
        if not self.model.multimodal:
            raise UnsupportedMediaError("checkpoint does not support media")
        served = getattr(self.model, "media_types", ())
        for item in request.media:
            if item.type not in served:
                why = self.model.info.get("media_unavailable")
                raise UnsupportedMediaError(f"this model does not serve {item.type} media"
                                            + (f" ({why})" if why else ""))
        if len(request.questions) > MAX_MEDIA_QUESTIONS:
            raise InvalidRequestError(f"media requests support at most {MAX_MEDIA_QUESTIONS} question(s)")
        if self.blend is not None:
            # The native pass reads its own prompt through the text layouts; it would drop the media.
            raise UnsupportedMediaError("the choice readout's native blend (choice_native_weight) takes text only")

    def _check_model(self, request: DecisionRequest) -> None:
        if request.model not in (None, self.model.model_id, LATEST_ALIAS):
            raise UnknownModelError(
                f"unknown model {request.model!r}; this deployment serves {self.model.model_id!r}"
            )

    def pending(self, admitted: Admitted) -> Pending:
        layout = self._layout_for(admitted)
        shape, real = self._cost(admitted)
        return Pending(admitted, shape.rows, shape.width, real,
                       alone=bool(admitted.request.media), prefix=shape.prefix, group=layout.name)

    def _cost(self, admitted: Admitted) -> tuple[Shape, int]:
        """(shape in a batch, real tokens) of a request, both passes counted when it blends."""
        layout = self._layout_for(admitted)
        shape, real = layout.shape(admitted.encoded), layout.real_tokens(admitted.encoded)
        if admitted.native is not None:
            # The native pass never uses the prefix cache: the configured layout runs it.
            shape = both_passes(shape, self.layout.shape(admitted.native))
            real += self.layout.real_tokens(admitted.native)
        return shape, real

    def _layout_for(self, admitted: Admitted):
        # Media tokens are not in the ids a cache entry is keyed on: never cached.
        if self._reuse is not None and not admitted.request.media:
            return self._reuse
        return self.layout

    # --- the two ways in -------------------------------------------------

    def decide(self, body: Any) -> dict:
        """Score one request, sharing a forward pass with concurrent callers. Thread-safe."""
        pending = self._commit.submit(self.pending(self.admit(body)))
        if isinstance(pending.outcome, JevanyError):
            raise pending.outcome
        return pending.outcome

    def score(self, admitted: list[Admitted], early: Callable[[list[tuple[int, Any]]], None] | None = None
              ) -> list[dict | JevanyError]:
        """Score requests handed over together, in as few passes as the limits allow. One thread.

        early, if given, gets [(index, outcome)...] after every pass that has
        more after it, so a server can answer those callers while the rest of
        the hand-over is still scoring.
        """
        pendings = [self.pending(a) for a in admitted]
        queue = deque(pendings)
        index = {id(p): i for i, p in enumerate(pendings)}

        def run(batch: list[Pending]) -> None:
            self._run_pending(batch)
            if early is not None and queue:
                early([(index[id(p)], p.outcome) for p in batch])

        drain(queue, self._take, run)
        return [p.outcome for p in pendings]

    # --- score -----------------------------------------------------------

    def _take(self, queue: deque) -> list[Pending]:
        batching = self.policy.allows_batching(queue[0].width)
        return take_batch(queue, self.batch_limits if batching else self.alone_limits)

    def _run_pending(self, batch: list[Pending]) -> None:
        outcomes = self.run_batch([p.item for p in batch])
        for p, outcome in zip(batch, outcomes):
            p.outcome, p.done = outcome, True

    def run_batch(self, batch: list[Admitted]) -> list[dict | JevanyError]:
        """One forward pass; if it fails, each request again alone so the error stays with its cause.

        A device that can run no more passes raises DeviceLost instead, now and
        on every later call: no request caused it, and none can be scored here.
        """
        if self.lost is not None:
            raise self.lost
        try:
            return self._forward(batch)
        except Exception as exc:   # noqa: BLE001 - any failure becomes a typed per-request error
            if is_device_lost(exc):
                self.lost = exc if isinstance(exc, DeviceLost) else DeviceLost(
                    f"the device cannot run passes any more: {type(exc).__name__}: {exc}")
                raise self.lost from exc
            if isinstance(exc, NonFiniteError):
                self.stats.non_finite += 1
            if is_out_of_memory(exc):
                release_cached_memory()
            if self._reuse is not None:     # a prefix this pass used may be what broke it
                self._reuse.forget([a.encoded for a in batch if self._layout_for(a) is self._reuse])
            if len(batch) == 1:
                return [_as_jevany_error(exc)]
        self.stats.retried_alone += len(batch)
        return [self.run_batch([a])[0] for a in batch]

    def _forward(self, batch: list[Admitted]) -> list[dict | JevanyError]:
        encs = [a.encoded for a in batch]
        model = self.model
        layout = self._layout_for(batch[0])     # one group per batch (batching.take_batch)
        costs = [self._cost(a) for a in batch]
        real = sum(r for _, r in costs)
        width = max(shape.width for shape, _ in costs)
        counts = [q.n_options for a in batch for q in a.request.questions]
        plan = self.readout.plan(counts, model.output_device)
        native_plan = None if self.blend is None else self.blend.readout.plan(counts, model.output_device)
        _sync(model.device)   # latency is the forward pass alone, between device syncs
        started = time.perf_counter()
        ok, padded = False, 0
        try:
            with torch.inference_mode():
                if batch[0].request.media:     # alone in its batch (Pending.alone)
                    with self._tokenizer_lock:
                        gathered, padded = media_forward(model, encs[0], [(m.type, m.uri) for m in
                                                                           batch[0].request.media])
                else:
                    gathered, padded = layout.forward(self._backbone, encs, self.pad_id, model.device,
                                                      model.dtype)
                probs = self.readout.probabilities(gathered, plan)
                if native_plan is not None:
                    native, extra = self._native_pass(batch, native_plan)
                    padded += extra
            _sync(model.device)
            check_finite(probs)    # CUDA kernels can return NaN where the CPU's return zeros
            if native_plan is not None:
                check_finite(native)
                probs = self.blend.pool(probs, native)
                check_finite(probs)
            ok = True
        finally:
            seconds = time.perf_counter() - started
            latency = round(seconds * 1000, 1)
            rec = BatchRecord(len(batch), padded, real, latency, ok,
                              tuple(sorted({a.origin for a in batch if a.origin is not None})))
            self.stats.record(rec)
            if ok:
                self.policy.record(width, len(batch), real, seconds)
            if self.observer is not None:
                self.observer(rec)
        results, at = [], 0
        for a in batch:
            n = len(a.request.questions)
            results.append(self._result(a, probs[at: at + n], latency, len(batch), padded))
            at += n
        return results

    def _native_pass(self, batch: list[Admitted], plan) -> tuple[list[list[float]], int]:
        """The checkpoint's own readout on the same batch, in the configured layout (never the prefix cache)."""
        model = self.model
        hidden, padded = self.layout.forward(self._backbone, [a.native for a in batch], self.pad_id, model.device,
                                             model.dtype)
        return self.blend.readout.probabilities(hidden, plan), padded

    def _backbone(self, *, attention_mask, padding_mask=None, return_cache: bool = False, cache=None, **inputs):
        """The decoder's final hidden states; with return_cache, and the cache a later pass continues from."""
        if attention_mask.dim() == 4:
            attention_mask = per_layer_type(self.model.layer_types, attention_mask, padding_mask)
        if cache is not None:
            inputs["cache"] = cache
        out = self.model.backbone(**inputs, attention_mask=attention_mask, use_cache=return_cache)
        return (out.last_hidden_state, out.cache) if return_cache else out.last_hidden_state

    def _result(self, admitted: Admitted, probs, latency_ms, size, padded) -> dict | InternalError:
        """The request's reply; InternalError, for this request alone, if an answer fails JevAny's self-check.

        JevAny checks every answer before it returns it, and so do we: no
        readout fault (unnormalised, out of range, not finite) reaches a caller.
        """
        answers = {}
        try:
            for q, p in zip(admitted.request.questions, probs):
                answers[q.qid] = shape_answer(q, p)
                validate_answer(q, answers[q.qid])
        except InternalError as exc:
            return exc
        return {
            "model": self.model.model_id,
            "answers": answers,
            "usage": {"input_tokens": admitted.encoded.input_tokens, "output_tokens": self._count(answers)},
            "latency_ms": latency_ms,
            "batch": {"size": size, "padded_tokens": padded},
        }

    def _count(self, answers: dict) -> int:
        # JevAny's accounting: the JSON of the answers, default separators, ASCII escaping.
        with self._tokenizer_lock:
            return len(self.model.tokenizer(json.dumps(answers), add_special_tokens=False)["input_ids"])

    def prefix_cache_stats(self) -> dict:
        if self.memory is None:
            return {"enabled": False, "size": 0, "hits": 0, "misses": 0}
        return self.memory.stats()

    def clear_prefix_cache(self) -> int:
        return 0 if self.memory is None else self.memory.clear()

    def reset_statistics(self) -> None:
        """Forget every pass so far (warm-up), for statistics and the batch policy alike."""
        self.stats = BatchStats()
        self.policy = BatchPolicy(adaptive=self.config.batch_policy == "adaptive")
        if getattr(self, "memory", None) is not None:
            self.memory.reset()

    # --- describe --------------------------------------------------------

    def describe(self) -> dict:
        m = self.model
        return {
            "id": m.model_id,
            "aliases": [] if m.model_id == LATEST_ALIAS else [LATEST_ALIAS],
            "source": m.source,
            "readout": m.readout,
            "layout": self.layout.name,
            "device": str(m.device),
            "dtype": DTYPE_NAMES.get(m.dtype, str(m.dtype)),
            "cpu_threads": torch.get_num_threads() if m.device.type == "cpu" else None,
            "context_window": m.context_window,
            "linear_attention": m.info.get("linear_attention"),   # which kernels, on hybrid models
            "random_weights": bool(m.info.get("random_weights")),  # the built-in demo model
            "max_options": self.max_options,
            "media_types": list(getattr(m, "media_types", ())),    # what media a request may carry
            "choice_readout": self._describe_choice(),
            "date_facts": self.config.date_facts,
            "limits": {
                "max_state_tokens": self.limits.state,
                "max_branch_tokens": self.limits.branch,
                "max_packed_tokens": self.config.max_packed_tokens,
                "max_batch_size": self.config.max_batch_size,
                "max_padding_waste": self.batch_limits.max_padding_waste,
            },
            "prefix_cache": self.prefix_cache_stats(),
            "batching": self.stats.as_dict() | {"policy": self.config.batch_policy,
                                                "measured_tokens_per_s": self.policy.as_dict()},
        }

    def _describe_choice(self) -> dict | None:
        """The choice readout's settings, under JevAny's names; None for the other readouts."""
        if self.model.readout != "choice":
            return None
        out = {"temperature": self.readout.temperature, "native_weight": self.config.choice_native_weight,
               "max_tokens": self.limits.choice}
        if self.blend is not None:
            out |= {"native_readout": self.blend.kind, "native_temperature": self.blend.temperature}
        return out


def _pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return candidate
    return 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _as_jevany_error(exc: Exception) -> JevanyError:
    if isinstance(exc, JevanyError):
        return exc
    if isinstance(exc, NonFiniteError):
        return InternalError(str(exc))
    return InternalError(f"scoring failed: {type(exc).__name__}: {exc}")
