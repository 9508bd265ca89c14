"""How encoded requests become one forward pass: rows or packed.

Rows: one causal row per question (shared prefix + branch), right-padded.
Exact on every architecture, recurrent layers included, because padding only
ever follows the real tokens.

Packed: one sequence per request (prefix once, then every branch) under a
block-causal 4D mask with positions restarting after the prefix. It runs the
shared state once, but it is only valid where a test proves it equals rows.
The mask is additive float, never boolean: eager attention silently
misreads boolean 4D masks in the transformers version we pin.

Shared: two passes. The prefixes of the batch, left-padded (padding before
the first real token leaves a recurrent state at zero), fill a cache; the
cache is replicated once per question, and the branches, right-padded,
continue from it. The state runs once even on hybrid recurrent models, where
packing is impossible.

No layout builds a query row that may attend to no key: CUDA turns such a
row into NaN, which spreads into real tokens (masks.py). Right padding never
does (a padded query sees the real tokens before it); left padding and
packing give padded positions their own diagonal.
"""
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from .masks import block_causal_mask, padded_causal_mask
from .prompts import Encoded

# Architectures whose layouts a test proves equal to rows
# (tests/engine/test_parity.py). Hybrid recurrent models can never pack.
PACKED_PROVEN = frozenset({"qwen3"})
SHARED_PROVEN = frozenset({"qwen3", "qwen3_5_text"})

# Runs the decoder: keyword arguments in, final hidden states [N, L, d] out
# (with return_cache=True: and the decoder cache a later pass continues from).
# A 4D attention_mask comes with padding_mask, the 2D mask recurrent layers read.
Backbone = Callable[..., torch.Tensor]


class Shape(NamedTuple):
    rows: int          # rows the request occupies in a branch pass
    width: int         # its longest row
    prefix: int = 0    # its prefix, when that runs in a pass of its own


def _gather(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    # A model spread over GPUs returns its states on the last one, not where the inputs went.
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, index.to(hidden.device, non_blocking=True))


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None
    padding_mask: torch.Tensor | None   # [N, L] 0/1, given beside a 4D attention_mask
    gather: torch.Tensor          # flat indices into [N*L] of every readout position, request by request
    padded_tokens: int


class _OnePass:
    def forward(self, backbone: Backbone, encs: list[Encoded], pad_id: int, device, dtype):
        """→ (hidden states at every readout position, padded tokens allocated)."""
        inputs = self.build(encs, pad_id, device, dtype)
        hidden = backbone(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                          position_ids=inputs.position_ids, padding_mask=inputs.padding_mask)
        return _gather(hidden, inputs.gather), inputs.padded_tokens


class RowsLayout(_OnePass):
    name = "rows"

    @staticmethod
    def shape(enc: Encoded) -> Shape:
        return Shape(len(enc.branches), max(enc.row_lengths))

    @staticmethod
    def real_tokens(enc: Encoded) -> int:
        return sum(enc.row_lengths)

    def build(self, encs: list[Encoded], pad_id: int, device, dtype) -> ForwardInputs:
        width = max(max(e.row_lengths) for e in encs)
        rows = [e.prefix + b.tokens for e in encs for b in e.branches]
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        gather = []
        r = 0
        for e in encs:
            for b in e.branches:
                row = e.prefix + b.tokens
                ids[r, : len(row)] = torch.tensor(row)
                mask[r, : len(row)] = 1
                gather += [r * width + len(e.prefix) + p for p in b.readout]
                r += 1
        return ForwardInputs(
            ids.to(device), mask.to(device), None, None,
            torch.tensor(gather, device=device), len(rows) * width,
        )


class PackedLayout(_OnePass):
    name = "packed"

    @staticmethod
    def shape(enc: Encoded) -> Shape:
        return Shape(1, enc.packed_length)

    @staticmethod
    def real_tokens(enc: Encoded) -> int:
        return enc.packed_length

    def build(self, encs: list[Encoded], pad_id: int, device, dtype) -> ForwardInputs:
        width = max(e.packed_length for e in encs)
        n = len(encs)
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        seg = torch.full((n, width), -1, dtype=torch.long)    # 0 = prefix, k = question k, -1 = padding
        pos = torch.zeros((n, width), dtype=torch.long)
        gather = []
        for i, e in enumerate(encs):
            p = len(e.prefix)
            ids[i, :p] = torch.tensor(e.prefix)
            seg[i, :p] = 0
            pos[i, :p] = torch.arange(p)
            start = p
            for k, b in enumerate(e.branches, 1):
                end = start + len(b.tokens)
                ids[i, start:end] = torch.tensor(b.tokens)
                seg[i, start:end] = k
                pos[i, start:end] = torch.arange(p, p + len(b.tokens))   # every branch restarts after the prefix
                gather += [i * width + start + r for r in b.readout]
                start = end
        seg = seg.to(device)
        return ForwardInputs(
            ids.to(device), block_causal_mask(seg, dtype), pos.to(device), (seg >= 0).long(),
            torch.tensor(gather, device=device), n * width,
        )


class SharedLayout:
    name = "shared"

    @staticmethod
    def shape(enc: Encoded) -> Shape:
        return Shape(len(enc.branches), max(len(b.tokens) for b in enc.branches), len(enc.prefix))

    @staticmethod
    def real_tokens(enc: Encoded) -> int:
        return enc.packed_length

    def forward(self, backbone: Backbone, encs: list[Encoded], pad_id: int, device, dtype):
        if all(len(e.branches) == 1 for e in encs):
            return RowsLayout().forward(backbone, encs, pad_id, device, dtype)   # nothing to share
        # Both passes' inputs go to the device before the first runs: a copy queued
        # behind a pass would wait for it.
        prefixes = self._prefixes(encs, pad_id)
        owners, branches = self._branches(encs, pad_id, prefixes[1])
        prefix_ids, prefix_mask, prefix_pos, owners, ids, mask, pos, gather = (
            t.to(device) for t in (*prefixes, owners, *branches))
        # Left padding: a padded query has no real key before it, so it keeps its diagonal.
        _, cache = backbone(input_ids=prefix_ids, attention_mask=padded_causal_mask(prefix_mask, dtype),
                            padding_mask=prefix_mask, position_ids=prefix_pos, return_cache=True)
        cache.reorder_cache(owners)    # one copy of its request's state per question
        hidden = backbone(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache)
        return _gather(hidden, gather), prefix_ids.numel() + ids.numel()

    @staticmethod
    def _branches(encs: list[Encoded], pad_id: int, prefix_mask: torch.Tensor):
        """(owner request of each row, (ids, mask over prefix + branch, positions, gather)), right-padded."""
        rows = [(i, e, b) for i, e in enumerate(encs) for b in e.branches]
        width = max(len(b.tokens) for _, _, b in rows)
        prefix_width = prefix_mask.shape[1]
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        pos = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), prefix_width + width), dtype=torch.long)
        gather = []
        for r, (owner, e, b) in enumerate(rows):
            n, p = len(b.tokens), len(e.prefix)
            ids[r, :n] = torch.tensor(b.tokens)
            pos[r, :n] = torch.arange(p, p + n)
            mask[r, :prefix_width] = prefix_mask[owner]
            mask[r, prefix_width: prefix_width + n] = 1
            gather += [r * width + i for i in b.readout]
        owners = torch.tensor([owner for owner, _, _ in rows])
        return owners, (ids, mask, pos, torch.tensor(gather))

    @staticmethod
    def _prefixes(encs: list[Encoded], pad_id: int):
        return left_padded([e.prefix for e in encs], pad_id)


def left_padded(sequences: list[tuple[int, ...]], pad_id: int):
    """(ids, 0/1 mask, positions) [N, longest], each sequence right-aligned: padding comes first."""
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    pos = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, tokens in enumerate(sequences):
        n = len(tokens)
        ids[i, width - n:] = torch.tensor(tokens)
        mask[i, width - n:] = 1
        pos[i, width - n:] = torch.arange(n)
    return ids, mask, pos
