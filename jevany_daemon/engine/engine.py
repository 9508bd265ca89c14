"""The decision engine: admit → take a batch → launch a pass → collect and shape. No sockets.

The same object serves in-process callers (``decide`` from any number of
threads, batched by group commit) and the daemon's worker, which admits
hand-overs with ``admit_many`` and keeps a pass on the device while it forms
the next (``launch``, then ``wait`` and ``finish``: worker/loop.py).
The stages are rooms of their own: admission.py, layouts.py and
prefix_reuse.py, passes.py, shaping.py; each is handed the parts it uses.
"""
from collections import deque
from dataclasses import replace
from itertools import islice
from typing import Any, Callable


from jevany_client.errors import JevanyError

from jevany_daemon.config import EngineConfig, default_padding_waste
from jevany_daemon.model.decision_model import DecisionModel
from jevany_daemon.model.device_reports import devices_report
from jevany_daemon.model.invariant import make_batch_invariant, round_width, rows_matmul
from jevany_daemon.model.kernels import opaque_linear_attention

from .admission import LATEST_ALIAS, MAX_MEDIA_QUESTIONS, Admission, Admitted
from .batching import SCAN_LIMIT, BatchLimits, GroupCommit, Pending, drain, take_batch
from .decoder import Decoder
from .describe import describe
from .faults import DeviceLost
from .layouts import PACKED_PROVEN, SHARED_PROVEN, FlatLayout, PackedLayout, RowsLayout, Shape, SharedLayout
from .native_blend import both_passes, native_blend
from .passes import Launched, Passes
from .batch_policy import BatchPolicy
from .prefix_cache import PrefixCache
from .prefix_reuse import SHARE_TOKENS, PackedReuse, RowReuse
from .prompts import Limits, make_encoder
from .readouts import make_readout
from .replay import Replay
from .shape_plan import ShapePlan
from .shaping import OutputTokens
from .stats import BatchRecord, BatchStats
from .stream import make_stream
from .thread_policy import ThreadPolicy

__all__ = ["Admitted", "BatchRecord", "BatchStats", "Engine", "LATEST_ALIAS", "MAX_MEDIA_QUESTIONS", "choose_layout"]



def choose_layout(model: DecisionModel, wanted: str, batch_invariant: bool = False):
    """auto: packed where proven, else shared where proven (hybrid models), else rows. Batch-invariant, each
    row padded alone to a rounded width (model/invariant.py): auto is flat where packed is proven (every layer
    but attention reads one token at a time), else rows; the settings refuse packed and shared."""
    packable = model.model_type in PACKED_PROVEN and not model.hybrid
    if batch_invariant:
        return FlatLayout(round_width) if wanted == "auto" and packable else RowsLayout(round_width)
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
        simulated_pass_ms: float | None = None,
    ):
        self.model, self.config, self.observer = model, config, observer
        # The device as passes see it; a simulated accelerator for benchmarks (stream.py).
        self.stream = make_stream(model.device, simulated_pass_ms)
        if config.batch_invariant:
            make_batch_invariant(model)       # the model's own kernels, for good: one engine per model
        self.layout = choose_layout(model, config.layout, config.batch_invariant)
        self.readout = make_readout(model, config.choice_temperature, config.batch_invariant)
        self.encoder = make_encoder(model)
        self.blend = native_blend(model, config.choice_native_weight, config.batch_invariant)
        self.max_options = self.readout.max_options
        if self.blend is not None:
            self.max_options = min(self.max_options, self.blend.readout.max_options)
        # With a prefix cache, every request without media continues from the longest
        # prefix the cache holds (prefix_reuse.py); the configured layout serves the rest.
        self.prefix_cache, self._reuse = _prefix_reuse(model, config, getattr(self.encoder, "head", ()), self.stream)
        window = model.context_window
        self.limits = Limits(min(config.max_state_tokens, window), min(config.max_branch_tokens, window), window,
                             min(config.choice_max_tokens, window))
        waste = config.max_padding_waste
        if waste is None:
            waste = default_padding_waste("cuda" if self.stream.asynchronous else model.device.type)
        self.batch_limits = BatchLimits(config.max_batch_size, config.max_packed_tokens, waste)
        self.alone_limits = replace(self.batch_limits, max_size=1)
        self.stats = BatchStats()
        # On an accelerator a lone pass costs nearly a full one: no pass is split to time one (batch_policy.py).
        self.policy = BatchPolicy(adaptive=config.batch_policy == "adaptive",
                                  explore_alone=not self.stream.asynchronous)
        # On a CPU, one thread or all of them, by what each class of pass measured (thread_policy.py).
        self.threads = ThreadPolicy(adaptive=config.thread_policy == "adaptive" and model.device.type == "cpu"
                                    and not self.stream.asynchronous and not config.batch_invariant)
        self.pad_id = _pad_id(model.tokenizer)
        self.admission = Admission(model=model, encoder=self.encoder, blend=self.blend, layout=self.layout,
                                   limits=self.limits, max_options=self.max_options,
                                   max_packed_tokens=config.max_packed_tokens, date_facts=config.date_facts)
        self.passes = Passes(model=model, stream=self.stream, backbone=Decoder(model), readout=self.readout,
                             blend=self.blend, layout=self.layout, layout_for=self.layout_for, pad_id=self.pad_id,
                             cost=self.cost, forget=self.forget, live_head=self.live_head,
                             output_tokens=OutputTokens(model.tokenizer), tokenizer_lock=self.admission.tokenizer_lock,
                             stats=self.stats, policy=self.policy, threads=self.threads, observe=self._observed)
        self._commit = GroupCommit(self._take, self._run_pending)

    # --- admit -----------------------------------------------------------

    def admit(self, body: Any, origin: str | None = None, tenant: str | None = None) -> Admitted:
        """Validate and encode; raises the typed error the caller should get.

        tenant: an opaque salt; requests of different tenants never share prefix-cache entries.
        """
        out = self.admission.admit_many([body], [origin], [tenant])[0]
        if isinstance(out, JevanyError):
            raise out
        return out

    def admit_many(self, bodies: list[Any], origins: list[str | None] | None = None,
                   tenants: list[str | None] | None = None) -> list[Admitted | JevanyError]:
        """Requests handed over together: each admitted or its typed error, tokenized in one batched call."""
        n = len(bodies)
        return self.admission.admit_many(bodies, origins or [None] * n, tenants or [None] * n)

    def pending(self, admitted: Admitted) -> Pending:
        pending = Pending(admitted, 0, 0, 0, alone=bool(admitted.request.media),
                          group=self.layout_for(admitted).name)
        self._costed(pending)
        return pending

    def _costed(self, p: Pending) -> None:
        shape, p.real = self.cost(p.item)
        p.rows, p.width, p.prefix, p.stem, p.shared, p.tails = (shape.rows, shape.width, shape.prefix, shape.stem,
                                                                shape.shared, shape.tails)

    def cost(self, admitted: Admitted) -> tuple[Shape, int]:
        """(shape in a batch, real tokens) of a request, both passes counted when it blends.

        Asked when it is queued, when a batch is taken if the cache changed meanwhile (_recost), and
        when its pass is launched; what the prefix cache holds is all that can change it in between,
        so it is remembered until the cache changes.
        """
        generation = self.prefix_cache.generation if self.prefix_cache is not None else 0
        if admitted.costed is not None and admitted.costed[0] == generation:
            return admitted.costed[1]
        admitted.costed = (generation, self._cost(admitted))
        return admitted.costed[1]

    def _cost(self, admitted: Admitted) -> tuple[Shape, int]:
        shape, real = self.layout_for(admitted).cost(admitted.encoded)   # the prefix cache's: one lookup
        if admitted.native is not None:
            # The native pass never uses the prefix cache: the configured layout runs it.
            native_shape, native_real = self.layout.cost(admitted.native)
            shape, real = both_passes(shape, native_shape), real + native_real
        return shape, real

    def layout_for(self, admitted: Admitted):
        # Media tokens are not in the ids a cache entry is keyed on: never cached.
        if self._reuse is not None and not admitted.request.media:
            return self._reuse
        return self.layout

    # --- the ways in -------------------------------------------------------

    def decide(self, body: Any) -> dict:
        """Score one request, sharing a forward pass with concurrent callers. Thread-safe."""
        pending = self._commit.submit(self.pending(self.admit(body)))
        if isinstance(pending.outcome, JevanyError):
            raise pending.outcome
        return pending.outcome

    def score(self, admitted: list[Admitted]) -> list[dict | JevanyError]:
        """Score requests handed over together, in as few passes as the limits allow. One thread."""
        pendings = [self.pending(a) for a in admitted]
        drain(deque(pendings), self._take, self._run_pending)
        return [p.outcome for p in pendings]

    def take(self, queue: deque) -> list[Pending]:
        """The next batch out of a queue of Pending, as the batch policy and limits allow."""
        return self._take(queue)

    def launch(self, batch: list[Admitted]) -> Launched:
        """Queue one pass on the device (see passes.py); collect it for the outcomes."""
        return self.passes.launch(batch)

    def collect(self, launched: Launched) -> list[dict | JevanyError]:
        """wait, then finish."""
        return self.passes.collect(launched)

    def wait(self, launched: Launched) -> None:
        """A launched pass's one sync: its probabilities reach the host (or its failure shows)."""
        self.passes.wait(launched)

    def finish(self, launched: Launched) -> list[dict | JevanyError]:
        """A waited-for pass's outcomes; a failed pass's requests are scored again, in halves."""
        return self.passes.finish(launched)

    @property
    def asynchronous(self) -> bool:
        """Whether the host is free while a pass runs (CUDA, the simulated accelerator): the worker overlaps
        its passes there, launching the next before it answers the last."""
        return self.stream.asynchronous

    @property
    def lost(self) -> DeviceLost | None:
        """DeviceLost, once the device failed beyond recovery (passes.py)."""
        return self.passes.lost

    def gathered(self, batch: list[Admitted]):
        """(hidden states, the readout's plan) of a batch: a pass's forward without its readout (training)."""
        return self.passes.gathered(batch)

    def run_batch(self, batch: list[Admitted]) -> list[dict | JevanyError]:
        """One pass; if it fails, its requests again in halves, down to one, so the error stays with its cause.

        A device that can run no more passes raises DeviceLost instead, now and
        on every later call: no request caused it, and none can be scored here.
        """
        return self.collect(self.launch(batch))

    def _take(self, queue: deque) -> list[Pending]:
        self._recost(queue)
        batching = self.policy.allows_batching(queue[0].width)
        return take_batch(queue, self.batch_limits if batching else self.alone_limits)

    def _recost(self, queue: deque) -> None:
        """Queued requests costed before the prefix cache last changed, costed again: what it holds
        decides what a pass computes of them, and requests on one stem must agree on it (batching._Cost)."""
        if self.prefix_cache is None:
            return
        generation = self.prefix_cache.generation
        for p in islice(queue, SCAN_LIMIT):       # all that take_batch looks at
            if p.item.costed is not None and p.item.costed[0] != generation:
                self._costed(p)

    def _run_pending(self, batch: list[Pending]) -> None:
        outcomes = self.run_batch([p.item for p in batch])
        for p, outcome in zip(batch, outcomes):
            p.outcome, p.done = outcome, True

    def forget(self, batch: list[Admitted]) -> None:
        """After a failed pass: drop every cached prefix its requests read or wrote."""
        if self._reuse is not None:
            self._reuse.forget([a.encoded for a in batch if self.layout_for(a) is self._reuse])

    def _observed(self, record: BatchRecord) -> None:
        if self.observer is not None:     # read at every pass: an observer may come after the engine
            self.observer(record)

    # --- the shape plan ----------------------------------------------------------

    def warm_plan(self, only=None) -> dict[str, float] | None:
        """Build the shape plan the settings ask for and run every bucket of it (replay.py); from then on a
        pass that fits a bucket runs in it, and batches are priced at their bucket's tokens. → seconds per
        warm-up phase, or None without a plan. Raises shape_plan.PlanTooLarge past config.warmup_limit.
        only: those of its buckets alone (a benchmark measuring a few shapes).

        After the engine's first pass (warmup.warm_up): the plan continues the prompt's head, once pinned.
        """
        runner = self.config.runner
        if runner is None:
            return None
        if runner == "compiled":
            opaque_linear_attention(self.model.causal_lm)     # fla's kernels cannot be traced: custom ops
        head = self.live_head()
        cached = head.width if head is not None else 0
        plan = ShapePlan.for_engine(self.config.max_batch_size, self.config.max_packed_tokens,
                                    self.model.context_window, cached)
        if only is not None:
            plan = plan.only(only)
        replay = Replay(plan, runner, self.readout, self.passes.backbone, self.model.dtype, self.model.device,
                        self.pad_id, compile_mode=self.config.compile,
                        graph_max_tokens=self.config.cuda_graph_max_tokens)
        phases = replay.warm_up(head, self._reuse.kit if head is not None else None, self.stream,
                                self.config.warmup_limit)
        self.passes.replay = replay
        if self._reuse is not None:
            # A stem pass of its own runs outside every bucket, as it comes: a whole forward, as on an
            # accelerator. Rows recompute a shared stem before it costs one (prefix_reuse.SHARE_TOKENS).
            self._reuse.share_tokens = SHARE_TOKENS[True]
        for layout in (self.layout, self._reuse):     # packed rows filled to the width whose bucket is least
            if layout is not None and hasattr(layout, "row_width"):
                layout.row_width = plan.packing_width
        priced = replace(self.batch_limits, price=plan.tokens)
        self.batch_limits, self.alone_limits = priced, replace(priced, max_size=1)
        return phases

    @property
    def replay(self) -> Replay | None:
        """The shape plan's buckets, once warm_plan has run them; passes run in them from then on."""
        return self.passes.replay

    def live_head(self):
        """The prompt's head as the prefix cache holds it now (what a pass continuing it joins), or None."""
        return self._reuse.head_entry() if self._reuse is not None else None

    def plan_stats(self) -> dict | None:
        return None if self.replay is None else self.replay.counts.as_dict()

    def prefix_cache_stats(self) -> dict:
        if self.prefix_cache is None:
            return {"enabled": False, "size": 0, "hits": 0, "misses": 0}
        return self.prefix_cache.stats()

    def clear_prefix_cache(self) -> int:
        return 0 if self.prefix_cache is None else self.prefix_cache.clear()

    def device_info(self) -> dict:
        """The model's devices: name, memory in use and in total (model/device_reports.py)."""
        return devices_report(self.model.devices)

    def statistics(self) -> dict:
        """The running figures a worker reports with its answers: passes, devices, prefix cache, shape plan, threads."""
        return self.stats.as_dict() | {"device_info": self.device_info(), "prefix_cache": self.prefix_cache_stats(),
                                       "plan": self.plan_stats(), "threads": self.threads.as_dict()}

    def reset_statistics(self) -> None:
        """Forget every pass so far (warm-up), for statistics and the batch policy alike."""
        self.stats.reset()
        self.policy.reset()
        self.threads.reset()
        if self.prefix_cache is not None:
            self.prefix_cache.reset()
        if self.replay is not None:
            self.replay.counts.reset()

    def describe(self) -> dict:
        """What the engine serves, and how: describe.py."""
        return describe(self)


def _prefix_reuse(model: DecisionModel, config: EngineConfig, head, stream):
    """(the prefix cache, the layout that continues from it), or (None, None): no cache, or not proven here."""
    # A continued pass computes a request's tokens apart from its kept prefix: not batch-invariant.
    if config.prefix_cache <= 0 or config.batch_invariant or model.model_type not in SHARED_PROVEN:
        return None, None
    cache = PrefixCache(config.prefix_cache, config.prefix_cache_bytes, config.prefix_min_tokens)
    reuse = PackedReuse if model.model_type in PACKED_PROVEN and not model.hybrid else RowReuse
    return cache, reuse(cache, head, stream, model.dtype)


def _pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return candidate
    return 0
