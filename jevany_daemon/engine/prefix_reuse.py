"""Passes that continue from cached prefixes: the layouts of the prefix cache (prefix_cache.py).

Each request's stem (the prompt's head and the state: prompts.Encoded.stem)
starts from the longest prefix the cache holds: the pinned head at least,
the whole state on a hit, an agent's previous turn when its state grew.
Only the rest is computed, identical stems in a batch once, and a new state
long enough to be worth it is kept.

How a batch runs depends on the architecture:

- PackedReuse (attention only, where packing is proven): one packed group
  per distinct stem (its part not yet computed, then every branch of every
  request on it) continuing from the cached rows under a block-causal mask;
  short groups continuing the same cached rows share a row.
  A new state's keys are cut out of the pass's cache afterwards, so a miss
  costs one forward, as it would with no cache.
- RowReuse (hybrid recurrent models): one row per question, continuing its
  stem's cached prefix; a row computes whatever of its stem the cache lacks,
  right-padded after it, so a batch of misses is one forward. A recurrent
  state exists only at the end of what a pass computed, so a stem to be
  kept (or shared by rows enough to be worth computing once) runs first, in
  a stem pass, and its rows continue it. Padding may come before a
  recurrence's first token but never after a cached state, so stems that
  continue a cached state run in stem passes of one new length each; stems
  that would only save the short head run from their first token,
  left-padded, together.

Prepared on the host (their lookups, layout and every index list in the
pass's one upload), they run on the device with a few ops of bookkeeping per
pass (cache_rows.py), whatever the depth.
"""
from array import array
from dataclasses import dataclass, field

from .cache_rows import Block, CacheKit, JoinPlan
from .layouts import Backbone, Joined, Shape, Single, padding_of
from .masks import block_causal_mask, padded_causal_mask
from .pass_inputs import Grid, Packing, Sent, Upload, gather_rows
from .prefix_cache import PrefixCache
from .prompts import Encoded

# A stem that several rows of a hybrid model's pass continue, and that the
# cache will not keep, runs once in a stem pass of its own when computing it
# again in every row would cost more than this many extra tokens; else every
# row computes it and the batch is one forward. One more forward costs every
# layer's dispatch again: on a GPU mostly that (stream.asynchronous), on a
# CPU some compute too, so a CPU recomputes less before it pays for a pass.
SHARE_TOKENS = {False: 256, True: 2048}


@dataclass(eq=False)
class _Stem:
    tokens: tuple[int, ...]
    cached: int                 # leading tokens the cache holds
    entry: Block | None         # what holds them
    requests: list[int] = field(default_factory=list)   # batch positions of the requests on this stem
    base: tuple[int, ...] | None = None                  # the entry the stem continues, if any
    source: tuple[Block, int] | None = None              # (block, row) once a stem pass computes it
    tenant: str | None = None                            # whose entries it reads and keeps (prefix_cache.py)

    def __post_init__(self):
        self.base = self.tokens[:self.cached] if self.cached else None

    @property
    def new(self) -> tuple[int, ...]:
        return self.tokens[self.cached:]


class _Reuse:
    name = "reuse"

    def __init__(self, prefix_cache: PrefixCache, head: tuple[int, ...], stream, dtype):
        self.prefix_cache, self.head, self.stream, self.dtype = prefix_cache, head, stream, dtype
        self.kit: CacheKit | None = None       # learnt from the first cache a pass returns
        self.share_tokens = SHARE_TOKENS[stream.asynchronous]
        self.row_width = None    # with a shape plan, its choice of the width packed rows fill (Packing.grid)

    def _tails(self, enc: Encoded) -> list[tuple[int, ...]]:
        # what each question adds after the stem: the rest of the shared prefix, then its branch
        rest = enc.prefix[len(enc.stem):]
        return [rest + b.tokens for b in enc.branches]

    @staticmethod
    def _tail_lengths(enc: Encoded) -> list[int]:
        # len() of each of _tails(enc), without building them: costs are asked for often
        rest = len(enc.prefix) - len(enc.stem)
        return [rest + len(b.tokens) for b in enc.branches]

    def _stems(self, backbone: Backbone, encs: list[Encoded]) -> dict[tuple, _Stem]:
        """Each distinct stem of the batch, per tenant, with what the cache holds of it for that tenant."""
        if self.head and self.head not in self.prefix_cache.pinned():
            self._pin_head(backbone)
        stems: dict[tuple, _Stem] = {}
        for i, enc in enumerate(encs):
            key = (enc.tenant, enc.stem)
            if key not in stems:
                stems[key] = _Stem(enc.stem, *self.prefix_cache.longest(enc.stem, enc.tenant), tenant=enc.tenant)
            stems[key].requests.append(i)
        return stems

    def _pin_head(self, backbone: Backbone) -> None:
        """Compute the prompt's head once (a forward of its own, the first time only) and pin it."""
        n = len(self.head)
        grid = Grid(0)
        grid.add(list(self.head), [0] * n, list(range(n)))
        upload = Upload()
        sent = grid.register(upload)
        upload.send(self.stream)
        padding = padding_of(sent.seg)
        _, cache = backbone(input_ids=sent.ids, attention_mask=padded_causal_mask(padding, self.dtype),
                            padding_mask=padding, position_ids=sent.pos, return_cache=True)
        self.kit = self.kit or CacheKit(cache)
        if not self.prefix_cache.pin(self.head, self.kit.take(cache, 0, 0, n)):
            self.head = ()     # bigger than the whole byte bound: computed with every request instead

    def head_entry(self) -> Block | None:
        """The pinned head's cached rows, which every request continues; None before it is pinned."""
        return self.prefix_cache.pinned_cache(self.head) if self.head else None

    def _keep(self, stem: _Stem, row: Block) -> None:
        self.prefix_cache.put(stem.tokens, row, extends=stem.base, tenant=stem.tenant)

    def forget(self, encs: list[Encoded]) -> None:
        """Drop every entry a failed pass read or wrote for these requests: one may be what broke it."""
        for enc in encs:
            while n := self.prefix_cache.peek(enc.stem, enc.tenant):
                self.prefix_cache.drop(enc.stem[:n], enc.tenant)


def stem_key(enc: Encoded) -> tuple:
    """What requests on one stem share in a pass (_stems: tenant and stem), hashable in O(1): bytes
    keep their hash, a tuple of token ids does not, and batching looks a key up per candidate."""
    return enc.tenant, array("q", enc.stem).tobytes()


class PackedReuse(_Reuse):
    """Attention only: one packed group per distinct stem, continuing what the cache holds of it; groups
    that continue the same cached rows share rows where they fit (pass_inputs.Packing)."""

    def cost(self, enc: Encoded) -> tuple[Shape, int]:
        """(shape, real tokens) from one lookup in the cache. Requests on one stem make one group in a
        pass (prepare), so their shapes name the stem and what of it the group computes once."""
        new, tails = len(enc.stem) - self.prefix_cache.peek(enc.stem, enc.tenant), sum(self._tail_lengths(enc))
        return Shape(1, new + tails, stem=stem_key(enc), shared=new, tails=tails), new + tails

    def prepare(self, encs: list[Encoded], pad_id: int, upload: Upload, backbone: Backbone) -> "_PackedJob":
        stems = list(self._stems(backbone, encs).values())
        packing = Packing()
        reads: dict[int, list[tuple[int, int]]] = {}     # request -> [(stem, column)...], question by question
        keep = []
        for g, stem in enumerate(stems):
            ids, seg = list(stem.new), [0] * len(stem.new)
            pos = list(range(stem.cached, len(stem.tokens)))
            k = 0
            for i in stem.requests:
                reads[i] = []
                for tail, branch in zip(self._tails(encs[i]), encs[i].branches):
                    k += 1
                    start = len(ids) + len(tail) - len(branch.tokens)
                    ids += tail
                    seg += [k] * len(tail)
                    pos += range(len(stem.tokens), len(stem.tokens) + len(tail))
                    reads[i] += [(g, start + p) for p in branch.readout]
            kept = bool(stem.new) and self.prefix_cache.eligible(stem.tokens)
            keep += [g] if kept else []
            # Stems continuing the same cached rows may share a row; one to keep leads its own (column 0).
            packing.add(ids, seg, pos, key=(id(stem.entry), stem.cached) if stem.cached else None, leader=kept)
        grid, placed, _ = packing.grid(pad_id, self.row_width)
        for i in range(len(encs)):
            for g, c in reads[i]:
                r, at = placed[g]
                grid.read(r, at + c)
        joined = None
        if any(stem.cached for stem in stems):
            first = {}
            for g, (r, _) in enumerate(placed):
                first.setdefault(r, stems[g])      # every stem of a row continues the same rows
            refs = [(s.entry, 0, s.cached) if s.cached else None for s in (first[r] for r in range(len(first)))]
            joined = Joined(JoinPlan(refs), upload)
        return _PackedJob(self, stems, grid.register(upload), joined, [(placed[g][0], g) for g in keep])


class _PackedJob:
    def __init__(self, reuse: PackedReuse, stems: list[_Stem], sent: Sent, joined: Joined | None,
                 keep: list[tuple[int, int]]):
        self.reuse, self.stems, self.sent, self.joined, self.keep = reuse, stems, sent, joined, keep

    def single(self) -> Single | None:
        """One forward that keeps nothing, continuing one entry or none (a pass that keeps a stem needs
        the pass's cache back)."""
        return None if self.keep else _single(self.sent, self.joined)

    def run(self, backbone: Backbone, dtype):
        s, reuse, keep = self.sent, self.reuse, bool(self.keep)
        if self.joined is not None:
            out = self.joined.forward(backbone, reuse.kit, s, dtype, return_cache=keep)
        else:
            out = backbone(input_ids=s.ids, attention_mask=block_causal_mask(s.seg, dtype), position_ids=s.pos,
                           padding_mask=padding_of(s.seg), return_cache=keep)
        hidden, cache = out if keep else (out, None)
        if keep:
            reuse.kit = reuse.kit or CacheKit(cache)
            cached = 0 if self.joined is None else self.joined.plan.width
            for r, g in self.keep:
                # A stem's keys, from column 0 of its row (it leads it): what was cached (the end of its
                # left-padded span), then what this pass computed.
                stem = self.stems[g]
                reuse._keep(stem, reuse.kit.take(cache, r, cached - stem.cached, cached + len(stem.new)))
        return gather_rows(hidden, s.gather), s.padded_tokens


def _single(sent: Sent, joined: Joined | None) -> Single | None:
    if joined is None:
        return Single(sent, None)
    return None if joined.plan.shared is None else Single(sent, joined.plan.shared)


class RowReuse(_Reuse):
    """Hybrid recurrent models: a row per question continuing its stem; stems worth keeping run first."""

    def cost(self, enc: Encoded) -> tuple[Shape, int]:
        """(shape, real tokens) from one lookup in the cache."""
        tails, new = self._tail_lengths(enc), len(enc.stem) - self.prefix_cache.peek(enc.stem, enc.tenant)
        if self._runs_first(enc.stem, new, len(tails)):
            return Shape(len(tails), max(tails), new), new + sum(tails)
        return Shape(len(tails), new + max(tails)), len(tails) * new + sum(tails)

    def _runs_first(self, stem: tuple[int, ...], new: int, rows: int) -> bool:
        """Whether a stem with `new` tokens to compute, read by `rows` rows, runs in a stem pass first."""
        return new > 0 and (self.prefix_cache.eligible(stem) or (rows - 1) * new > self.share_tokens)

    def prepare(self, encs: list[Encoded], pad_id: int, upload: Upload, backbone: Backbone) -> "_RowJob":
        stems = self._stems(backbone, encs)
        rows_on = {key: sum(len(encs[i].branches) for i in s.requests) for key, s in stems.items()}
        first = [s for key, s in stems.items() if self._runs_first(s.tokens, len(s.new), rows_on[key])]
        passes = [self._stem_pass(group, pad_id, upload) for group in self._groups(first)]
        grid, refs = Grid(pad_id), []
        for enc in encs:
            stem = stems[(enc.tenant, enc.stem)]
            recompute = () if stem.source is not None or not stem.new else stem.new
            start = len(enc.stem) - len(recompute)
            if stem.source is not None:
                ref = (*stem.source, len(stem.tokens))
            else:
                ref = (stem.entry, 0, stem.cached) if stem.cached else None
            for tail, branch in zip(self._tails(enc), enc.branches):
                ids = [*recompute, *tail]
                r = grid.add(ids, [1] * len(ids), list(range(start, start + len(ids))))
                refs.append(ref)
                for p in branch.readout:
                    grid.read(r, len(ids) - len(branch.tokens) + p)
        joined = Joined(JoinPlan(refs), upload) if any(ref is not None for ref in refs) else None
        return _RowJob(self, passes, grid.register(upload), joined)

    def _groups(self, todo: list[_Stem]) -> list[list[_Stem]]:
        """Stem passes: new stems from their first token together; continuations by new length."""
        pinned = set(self.prefix_cache.pinned())
        if len(todo) > 1:
            # Continuing the head alone saves too little to be worth a pass per length.
            fresh = [s for s in todo if not s.cached or s.base in pinned]
            if len(fresh) > 1:
                for s in fresh:
                    s.cached, s.entry, s.base = 0, None, None
        by_length: dict[int, list[_Stem]] = {}
        for s in todo:
            by_length.setdefault(len(s.new) if s.cached else -1, []).append(s)
        return list(by_length.values())

    def _stem_pass(self, group: list[_Stem], pad_id: int, upload: Upload) -> "_StemPass":
        """One stem pass: from the first token, left-padded, or continuing cached rows with one new length."""
        scratch = not group[0].cached
        grid = Grid(pad_id, left=scratch)
        for s in group:
            grid.add(list(s.new), [1] * len(s.new), list(range(s.cached, len(s.tokens))))
        joined = None if scratch else Joined(JoinPlan([(s.entry, 0, s.cached) for s in group]), upload)
        sent = grid.register(upload)
        block = Block(len(group), sent.width + (0 if joined is None else joined.plan.width))
        for r, s in enumerate(group):
            s.source = (block, r)
        return _StemPass(group, sent, joined, block)


@dataclass
class _StemPass:
    group: list[_Stem]
    sent: Sent
    joined: Joined | None
    block: Block                # what the pass computes: each stem's row, its real positions last


class _RowJob:
    def __init__(self, reuse: RowReuse, passes: list[_StemPass], sent: Sent, joined: Joined | None):
        self.reuse, self.passes, self.sent, self.joined = reuse, passes, sent, joined

    def single(self) -> Single | None:
        return None if self.passes else _single(self.sent, self.joined)

    def run(self, backbone: Backbone, dtype):
        reuse = self.reuse
        padded = sum(p.sent.padded_tokens for p in self.passes)
        for p in self.passes:
            self._run_stems(backbone, p, dtype)
        s = self.sent
        if self.joined is not None:
            hidden = self.joined.forward(backbone, reuse.kit, s, dtype)
        else:
            padding = padding_of(s.seg)
            hidden = backbone(input_ids=s.ids, attention_mask=padded_causal_mask(padding, dtype), padding_mask=padding,
                              position_ids=s.pos)
        return gather_rows(hidden, s.gather), padded + s.padded_tokens

    def _run_stems(self, backbone: Backbone, p: _StemPass, dtype) -> None:
        reuse, s = self.reuse, p.sent
        if p.joined is not None:
            _, cache = p.joined.forward(backbone, reuse.kit, s, dtype, return_cache=True)
        else:
            padding = padding_of(s.seg)
            # Left padding: a padded query has no real key before it, so it keeps its diagonal.
            _, cache = backbone(input_ids=s.ids, attention_mask=padded_causal_mask(padding, dtype),
                                padding_mask=padding, position_ids=s.pos, return_cache=True)
        reuse.kit = reuse.kit or CacheKit(cache)
        filled = reuse.kit.block(cache)
        p.block.kv, p.block.conv, p.block.recurrent = filled.kv, filled.conv, filled.recurrent
        for r, stem in enumerate(p.group):
            if reuse.prefix_cache.eligible(stem.tokens):
                reuse._keep(stem, p.block.row(r, len(stem.tokens)))
