"""One pass, in two halves: launch (lay out, upload, queue the forward) and collect (wait, check, shape).

Between the two the device runs and the host is free: the worker admits
what arrived and forms the next pass then (worker/loop.py). A pass talks
to the device three times: one upload of every input it needs, the kernels
it queues, one download of every probability it produced (stream.py). A
failure may show at either half (on CUDA an error surfaces when the host
waits); either way the pass failed, and its requests are scored again in
halves, down to one, so an error stays with the request that caused it.

Passes are handed the parts they use (model, stream, decoder, readouts,
layouts, statistics) and the engine's costs as callables, never the engine.
gathered is a pass's forward alone, for training on what a pass computes.
"""
from dataclasses import dataclass

import torch

from jevany_client.errors import InternalError, JevanyError

from .faults import (DeviceLost, NonFiniteError, check_finite, detached, is_device_lost, is_out_of_memory,
                     release_cached_memory)
from .media_pass import media_forward
from .pass_inputs import Upload
from .readouts import split
from .shaping import answers_of
from .stats import BatchRecord
from .stream import Ticket


@dataclass(eq=False)
class Launched:
    """A pass on its way: what it holds, and its probabilities' ticket (or the error that stopped it)."""
    batch: list                   # Admitted, in order
    counts: list[int]             # options per question, request by request
    real: int = 0                 # real tokens it computes
    width: int = 0                # its widest request (what the batch policy learns by)
    ticket: Ticket | None = None
    padded: int = 0
    blended: bool = False         # its probabilities end with the native readout's, for the blend
    error: BaseException | None = None
    probs: list | None = None     # once waited for: per question
    seconds: float = 0.0          # the pass's time, as the stream measured it
    fixed: bool = False           # run in a bucket of the shape plan: its download in the readout's fixed layout
    threads: int = 0              # torch threads it ran on (thread_policy.py)


class Passes:
    """Launches and collects passes, handed every part a pass uses (never the engine that composes them)."""

    def __init__(self, *, model, stream, backbone, readout, blend, layout, layout_for, pad_id: int, cost, forget,
                 live_head, output_tokens, tokenizer_lock, stats, policy, threads, observe):
        self.model, self.stream = model, stream
        self.backbone = backbone        # runs the decoder (decoder.Decoder); what every forward of a pass calls
        self.readout, self.blend = readout, blend       # blend: the native readout pooled in, or None
        # The layout a request's pass takes (the prefix cache's, or the configured one: layout, which also
        # runs every native pass), and the engine's costs and cache upkeep, which depend on both.
        self.layout, self.layout_for, self.pad_id = layout, layout_for, pad_id
        self.cost, self.forget, self.live_head = cost, forget, live_head
        self.output_tokens = output_tokens
        self.tokenizer_lock = tokenizer_lock    # admission's: fast tokenizers are not safe to share across threads
        self.stats, self.policy = stats, policy
        self.threads = threads          # thread_policy.ThreadPolicy: the torch threads each pass runs on
        self.observe = observe          # called with every pass's BatchRecord
        self.replay = None              # replay.Replay: the shape plan's buckets, once the engine has warmed them
        self.lost: DeviceLost | None = None     # once the device failed beyond recovery

    # --- launch -----------------------------------------------------------

    def launch(self, batch: list) -> Launched:
        """Queue one pass of these requests on the device; never raises (a failure rides in .error)."""
        if self.lost is not None:
            raise self.lost
        counts = [q.n_options for a in batch for q in a.request.questions]
        launched = Launched(batch, counts, blended=self.blend is not None)
        # Chosen by the requests' costs before the layout prepares them (remembered: engine.cost).
        launched.threads = self.threads.choose(sum(self.cost(a)[1] for a in batch))
        try:
            with torch.inference_mode(), self.threads.running(launched.threads):
                self._queue(launched)
        except Exception as exc:   # noqa: BLE001 - collect() turns it into per-request outcomes
            launched.error = detached(exc)
        return launched

    def _queue(self, launched: Launched) -> None:
        batch, model, stream, backbone = launched.batch, self.model, self.stream, self.backbone
        began = stream.begin()
        upload = Upload()
        media = batch[0].request.media      # alone in its batch (Pending.alone)
        job = None if media else self.layout_for(batch[0]).prepare([a.encoded for a in batch], self.pad_id,
                                                                    upload, backbone)
        self._account(launched)      # once prepared: preparing may have pinned the prompt's head
        fixed = self._fixed(launched, job, media)
        if fixed is not None:
            launched.padded, launched.fixed = fixed.bucket.tokens, True
            launched.ticket = stream.download(self.replay.run(fixed, stream), began, fixed.used)
            return
        plan = self.readout.plan(launched.counts, upload)
        native_plan = self.blend.readout.plan(launched.counts, upload) if launched.blended else None
        native_job = (self.layout.prepare([a.native for a in batch], self.pad_id, upload, backbone)
                      if native_plan is not None else None)
        upload.send(stream)      # every input of the pass, in one copy, before its first kernel
        if media:
            with self.tokenizer_lock:
                gathered, padded = media_forward(model, batch[0].encoded, [(m.type, m.uri) for m in media])
        else:
            gathered, padded = job.run(backbone, model.dtype)
        probs = self.readout.probabilities(gathered, plan)
        if native_job is not None:
            # The checkpoint's own readout on the same batch, in the configured layout (never the prefix cache).
            hidden, extra = native_job.run(backbone, model.dtype)
            probs = torch.cat([probs, self.blend.readout.probabilities(hidden, native_plan)])
            padded += extra
        launched.padded = padded
        launched.ticket = stream.download(probs.float(), began)

    def _account(self, launched: Launched) -> None:
        """What the pass computes: its real tokens (a shared stem once) and its widest request."""
        costs = [self.cost(a) for a in launched.batch]
        launched.real, computed = 0, set()
        for shape, real in costs:
            if shape.stem is not None and shape.stem in computed:
                real -= shape.shared        # its stem is computed once, in the row it shares (batching._Cost)
            computed.add(shape.stem)
            launched.real += real
        launched.width = max(shape.width for shape, _ in costs)

    def _fixed(self, launched: Launched, job, media):
        """The pass in a bucket of the shape plan, or None: no plan, or the pass is not one it runs."""
        replay = self.replay
        if replay is None:
            return None
        if media or launched.blended:
            replay.count_eager("media" if media else "blend")
            return None
        return replay.fixed(job, launched.counts, self.live_head())

    def gathered(self, batch: list) -> tuple:
        """(the hidden states the readout reads, the readout's plan) of a batch in the configured layout: a
        pass's forward without its probabilities, with gradients if the caller allows (starter/train.py)."""
        upload = Upload()
        job = self.layout.prepare([a.encoded for a in batch], self.pad_id, upload, self.backbone)
        plan = self.readout.plan([q.n_options for a in batch for q in a.request.questions], upload)
        upload.send(self.stream)
        hidden, _ = job.run(self.backbone, self.model.dtype)
        return hidden, plan

    # --- collect ----------------------------------------------------------

    def collect(self, launched: Launched) -> list:
        """Wait for a launched pass; → each request's result or JevanyError. Fails over to scoring in halves."""
        self.wait(launched)
        return self.finish(launched)

    def wait(self, launched: Launched) -> None:
        """The pass's one sync: its probabilities reach the host (or its failure shows)."""
        if launched.error is None and launched.probs is None:
            try:
                launched.probs, launched.seconds = self._probabilities(launched)
            except Exception as exc:   # noqa: BLE001 - finish() handles it, as a launch failure
                launched.error = detached(exc)

    def finish(self, launched: Launched) -> list:
        """A waited-for pass's outcomes: answers shaped, or its requests scored again (_failed)."""
        self._record(launched, launched.seconds)
        if launched.error is not None:
            return self._failed(launched)
        return self._results(launched, launched.probs, round(launched.seconds * 1000, 1))

    def _probabilities(self, launched: Launched) -> tuple[list[list[float]], float]:
        flat, seconds = self.stream.wait(launched.ticket)
        if launched.fixed:
            probs = self.readout.unpack(flat, launched.counts)
            check_finite(probs)
            return probs, seconds
        n = sum(launched.counts)
        probs = split(flat[:n], launched.counts)
        check_finite(probs)    # CUDA kernels can return NaN where the CPU's return zeros
        if launched.blended:
            native = split(flat[n:], launched.counts)
            check_finite(native)
            probs = self.blend.pool(probs, native)
            check_finite(probs)
        return probs, seconds

    def _record(self, launched: Launched, seconds: float) -> None:
        ok, batch = launched.error is None, launched.batch
        rec = BatchRecord(len(batch), launched.padded, launched.real, round(seconds * 1000, 1), ok,
                          tuple(sorted({a.origin for a in batch if a.origin is not None})))
        self.stats.record(rec)
        if ok:
            self.policy.record(launched.width, len(batch), launched.real, seconds)
            self.threads.record(launched.real, launched.threads, seconds)
        self.observe(rec)

    def _failed(self, launched: Launched) -> list:
        """A failed pass: its requests again in halves, unless the device itself is gone.

        Halves, not each request alone: a request that breaks every pass it
        joins is found in about 2·log2(n) more passes, not n, and the half
        without it is answered by the first of them (benchmarks/poison_bench.py).
        A failure of the whole batch (out of memory) gives its halves their
        chance to fit; one that fails any pass of two ends in 2n - 1 passes."""
        exc, batch = launched.error, launched.batch
        if is_device_lost(exc):
            self.lost = exc if isinstance(exc, DeviceLost) else DeviceLost(
                f"the device cannot run passes any more: {type(exc).__name__}: {exc}")
            raise self.lost from exc
        if isinstance(exc, NonFiniteError):
            self.stats.non_finite += 1
        if is_out_of_memory(exc):
            release_cached_memory()
        self.forget(batch)      # a prefix this pass used may be what broke it
        if len(batch) == 1:
            return [_as_jevany_error(exc)]
        self.stats.retried += len(batch)
        half = len(batch) // 2
        return [*self.collect(self.launch(batch[:half])), *self.collect(self.launch(batch[half:]))]

    def _results(self, launched: Launched, probs: list[list[float]], latency_ms: float) -> list:
        """Each request's reply, its answers checked; usage counted for the whole pass at once."""
        batch = launched.batch
        outcomes, at = [], 0
        for a in batch:
            n = len(a.request.questions)
            outcomes.append(answers_of(a.request.questions, probs[at: at + n]))
            at += n
        replies = [o for o in outcomes if not isinstance(o, JevanyError)]
        with self.tokenizer_lock:
            counts = iter(self.output_tokens.counts(replies))
        size, padded = len(batch), launched.padded
        return [o if isinstance(o, JevanyError) else {
            "model": self.model.model_id,
            "answers": o,
            "usage": {"input_tokens": a.encoded.input_tokens, "output_tokens": next(counts)},
            "latency_ms": latency_ms,
            "batch": {"size": size, "padded_tokens": padded},
        } for a, o in zip(batch, outcomes)]


def _as_jevany_error(exc: BaseException) -> JevanyError:
    if isinstance(exc, JevanyError):
        return exc
    if isinstance(exc, NonFiniteError):
        return InternalError(str(exc))
    return InternalError(f"scoring failed: {type(exc).__name__}: {exc}")
