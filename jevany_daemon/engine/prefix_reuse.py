"""Passes that continue from cached prefixes: the layouts of the prefix cache (prefix_cache.py).

Each request's stem (the prompt's head and the state: prompts.Encoded.stem)
starts from the longest prefix the cache holds: the pinned head at least,
the whole state on a hit, an agent's previous turn when its state grew.
Only the rest is computed, identical stems in a batch once, and a new state
long enough to be worth it is kept.

How a batch runs depends on the architecture:

- OnePass (attention only, where packing is proven): one packed row per
  distinct stem (its part not yet computed, then every branch of every
  request on it) continuing from the cached rows under a block-causal mask.
  A new state's keys are cut out of the pass's cache afterwards, so a miss
  costs one pass, as it would with no cache.
- TwoPass (hybrid recurrent models): a recurrent state exists only at the end
  of what a pass computed, so the stems run first and the branches continue
  from them, as in the shared layout. Padding may come before a recurrence's
  first token but never after a cached state, so stems that continue a
  cached state run in passes of one new length each; stems that would only
  save the short head run from their first token, left-padded, together.
"""
from dataclasses import dataclass, field

import torch

from .cache_rows import join_rows, take_rows
from .layouts import Backbone, Shape, _gather, left_padded
from .masks import block_causal_mask, continued_block_causal_mask, padded_causal_mask
from .prefix_cache import PrefixCache
from .prompts import Encoded


@dataclass
class _Stem:
    tokens: tuple[int, ...]
    cached: int                 # leading tokens the cache holds (all of them, once computed)
    row: object | None          # their single-row decoder cache
    requests: list[int] = field(default_factory=list)   # batch positions of the requests on this stem
    base: tuple[int, ...] | None = None                  # the entry the stem continues, if any

    def __post_init__(self):
        self.base = self.tokens[:self.cached] if self.cached else None

    @property
    def new(self) -> tuple[int, ...]:
        return self.tokens[self.cached:]


class _Reuse:
    def __init__(self, memory: PrefixCache, head: tuple[int, ...] = ()):
        self.memory, self.head = memory, head

    def _tails(self, enc: Encoded) -> list[tuple[int, ...]]:
        # what each question adds after the stem: the rest of the shared prefix, then its branch
        rest = enc.prefix[len(enc.stem):]
        return [rest + b.tokens for b in enc.branches]

    def real_tokens(self, enc: Encoded) -> int:
        return len(enc.stem) - self.memory.peek(enc.stem) + sum(map(len, self._tails(enc)))

    def _stems(self, backbone: Backbone, encs: list[Encoded], device) -> dict[tuple[int, ...], _Stem]:
        """Each distinct stem of the batch, with what the cache holds of it."""
        if self.head and self.head not in self.memory.pinned():
            self._pin_head(backbone, device)
        stems: dict[tuple[int, ...], _Stem] = {}
        for i, enc in enumerate(encs):
            if enc.stem not in stems:
                stems[enc.stem] = _Stem(enc.stem, *self.memory.longest(enc.stem))
            stems[enc.stem].requests.append(i)
        return stems

    def _pin_head(self, backbone: Backbone, device) -> None:
        n = len(self.head)
        ids = torch.tensor([self.head], device=device)
        _, cache = backbone(input_ids=ids, attention_mask=torch.ones_like(ids),
                            position_ids=torch.arange(n, device=device)[None], return_cache=True)
        if not self.memory.pin(self.head, take_rows(cache, [n])[0]):
            self.head = ()     # bigger than the whole byte bound: computed with every request instead

    def _keep(self, stem: _Stem, row) -> None:
        self.memory.put(stem.tokens, row, extends=stem.base)

    def forget(self, encs: list[Encoded]) -> None:
        """Drop every entry a failed pass read or wrote for these requests: one may be what broke it."""
        for enc in encs:
            while n := self.memory.peek(enc.stem):
                self.memory.drop(enc.stem[:n])


class OnePass(_Reuse):
    name = "reuse"

    def shape(self, enc: Encoded) -> Shape:
        return Shape(1, self.real_tokens(enc))

    def forward(self, backbone: Backbone, encs: list[Encoded], pad_id: int, device, dtype):
        stems = list(self._stems(backbone, encs, device).values())
        rows = []           # per stem: (ids, segment, position) lists
        readouts = {}       # request index -> [(row, position)...], question by question
        for r, stem in enumerate(stems):
            ids, seg = list(stem.new), [0] * len(stem.new)
            pos = list(range(stem.cached, len(stem.tokens)))
            k = 0
            for i in stem.requests:
                readouts[i] = []
                for tail, branch in zip(self._tails(encs[i]), encs[i].branches):
                    k += 1
                    start, rest = len(ids), len(tail) - len(branch.tokens)
                    ids += tail
                    seg += [k] * len(tail)
                    pos += range(len(stem.tokens), len(stem.tokens) + len(tail))
                    readouts[i] += [(r, start + rest + p) for p in branch.readout]
            rows.append((ids, seg, pos))
        width = max(len(ids) for ids, _, _ in rows)
        n = len(rows)
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        seg = torch.full((n, width), -1, dtype=torch.long)
        pos = torch.zeros((n, width), dtype=torch.long)
        for r, (i, s, p) in enumerate(rows):
            ids[r, :len(i)], seg[r, :len(s)], pos[r, :len(p)] = torch.tensor(i), torch.tensor(s), torch.tensor(p)
        gather = torch.tensor([r * width + p for i in range(len(encs)) for r, p in readouts[i]])
        cache, cached_width = None, 0
        if any(stem.cached for stem in stems):
            cache, cached = join_rows([stem.row for stem in stems], [stem.cached for stem in stems])
            cached_width = cached.shape[1]
            mask = continued_block_causal_mask(cached.to(device), seg.to(device), dtype)
        else:
            mask = block_causal_mask(seg.to(device), dtype)
        keep = [r for r, stem in enumerate(stems) if stem.new and self.memory.eligible(stem.tokens)]
        out = backbone(input_ids=ids.to(device), attention_mask=mask, position_ids=pos.to(device),
                       padding_mask=(seg >= 0).long().to(device), cache=cache, return_cache=bool(keep))
        hidden, cache = out if keep else (out, None)
        if keep:
            # A stem's keys: what was cached, then what this pass computed right after it.
            spans = take_rows(cache, [len(stems[r].tokens) for r in keep],
                              [cached_width + len(stems[r].new) for r in keep], rows=keep)
            for r, row in zip(keep, spans):
                self._keep(stems[r], row)
        return _gather(hidden, gather.to(device)), n * width


class TwoPass(_Reuse):
    name = "reuse"

    def shape(self, enc: Encoded) -> Shape:
        tails = self._tails(enc)
        return Shape(len(tails), max(map(len, tails)), len(enc.stem) - self.memory.peek(enc.stem))

    def forward(self, backbone: Backbone, encs: list[Encoded], pad_id: int, device, dtype):
        stems = self._stems(backbone, encs, device)
        padded = self._compute_stems(backbone, [s for s in stems.values() if s.new], pad_id, device, dtype)
        cache, stem_mask = join_rows([stems[e.stem].row for e in encs], [len(e.stem) for e in encs])
        owners, ids, mask, pos, gather = (t.to(device) for t in self._branches(encs, pad_id, stem_mask))
        cache.reorder_cache(owners)    # one copy of its request's state per question
        hidden = backbone(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache)
        return _gather(hidden, gather), padded + ids.numel()

    def _compute_stems(self, backbone: Backbone, todo: list[_Stem], pad_id: int, device, dtype) -> int:
        """Fill in every stem's row; → padded tokens allocated."""
        pinned = set(self.memory.pinned())
        if len(todo) > 1:
            # Continuing the head alone saves too little to be worth a pass per length.
            fresh = [s for s in todo if not s.cached or s.base in pinned]
            if len(fresh) > 1:
                for s in fresh:
                    s.cached, s.row, s.base = 0, None, None
        padded = 0
        by_length: dict[int, list[_Stem]] = {}
        for s in todo:
            by_length.setdefault(len(s.new) if s.cached else -1, []).append(s)
        for length, group in by_length.items():
            padded += (self._from_scratch if length < 0 else self._continue)(backbone, group, pad_id, device, dtype)
            for s in group:
                self._keep(s, s.row)
        return padded

    def _continue(self, backbone: Backbone, group: list[_Stem], pad_id: int, device, dtype) -> int:
        """Stems that add the same number of tokens to what is cached: no padding after a state."""
        cache, cached = join_rows([s.row for s in group], [s.cached for s in group])
        ids = torch.tensor([s.new for s in group])
        pos = torch.tensor([list(range(s.cached, len(s.tokens))) for s in group])
        mask = torch.cat([cached, torch.ones_like(ids)], dim=1)
        _, cache = backbone(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                            cache=cache, return_cache=True)
        for s, row in zip(group, take_rows(cache, [len(s.tokens) for s in group])):
            s.cached, s.row = len(s.tokens), row
        return ids.numel()

    def _from_scratch(self, backbone: Backbone, group: list[_Stem], pad_id: int, device, dtype) -> int:
        """Stems from their first token, left-padded: padding before a recurrence leaves its state at zero."""
        ids, mask, pos = (t.to(device) for t in left_padded([s.tokens for s in group], pad_id))
        # Left padding: a padded query has no real key before it, so it keeps its diagonal.
        _, cache = backbone(input_ids=ids, attention_mask=padded_causal_mask(mask, dtype), padding_mask=mask,
                            position_ids=pos, return_cache=True)
        for s, row in zip(group, take_rows(cache, [len(s.tokens) for s in group])):
            s.cached, s.row = len(s.tokens), row
        return ids.numel()

    def _branches(self, encs: list[Encoded], pad_id: int, stem_mask: torch.Tensor):
        """(owner request of each row, ids, mask over stem + tail, positions, gather), right-padded."""
        rows = [(i, len(e.stem), tail, b) for i, e in enumerate(encs) for tail, b in zip(self._tails(e), e.branches)]
        width = max(len(tail) for _, _, tail, _ in rows)
        stem_width = stem_mask.shape[1]
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        pos = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), stem_width + width), dtype=torch.long)
        gather = []
        for r, (owner, p, tail, b) in enumerate(rows):
            n, rest = len(tail), len(tail) - len(b.tokens)
            ids[r, :n] = torch.tensor(tail)
            pos[r, :n] = torch.arange(p, p + n)
            mask[r, :stem_width] = stem_mask[owner]
            mask[r, stem_width: stem_width + n] = 1
            gather += [r * width + rest + i for i in b.readout]
        owners = torch.tensor([owner for owner, _, _, _ in rows])
        return owners, ids, mask, pos, torch.tensor(gather)
