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
"""
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from .prompts import Encoded

# Architectures whose layouts a test proves equal to rows
# (tests/engine/test_parity.py). Hybrid recurrent models can never pack.
PACKED_PROVEN = frozenset({"qwen3"})
SHARED_PROVEN = frozenset({"qwen3", "qwen3_5_text"})

# Runs the decoder: keyword arguments in, final hidden states [N, L, d] out.
Backbone = Callable[..., torch.Tensor]


class Shape(NamedTuple):
    rows: int          # rows the request occupies in a branch pass
    width: int         # its longest row
    prefix: int = 0    # its prefix, when that runs in a pass of its own


def _gather(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None
    gather: torch.Tensor          # flat indices into [N*L] of every readout position, request by request
    padded_tokens: int


class _OnePass:
    def forward(self, backbone: Backbone, encs: list[Encoded], pad_id: int, device, dtype):
        """→ (hidden states at every readout position, padded tokens allocated)."""
        inputs = self.build(encs, pad_id, device, dtype)
        hidden = backbone(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                          position_ids=inputs.position_ids)
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
            ids.to(device), mask.to(device), None,
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
        return ForwardInputs(
            ids.to(device), block_causal_mask(seg.to(device), dtype), pos.to(device),
            torch.tensor(gather, device=device), n * width,
        )


def block_causal_mask(seg: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [B,1,L,L] mask: i sees j iff j <= i and j is prefix or in i's own branch."""
    width = seg.shape[1]
    idx = torch.arange(width, device=seg.device)
    causal = idx[None, :] <= idx[:, None]
    key, query = seg[:, None, :], seg[:, :, None]
    allowed = causal & (key >= 0) & ((key == 0) | (key == query))
    allowed |= torch.eye(width, dtype=torch.bool, device=seg.device)   # keeps padded queries finite
    mask = torch.zeros(allowed.shape, dtype=dtype, device=seg.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


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
        prefix_ids, prefix_mask, prefix_pos = self._prefixes(encs, pad_id)
        cache = backbone(input_ids=prefix_ids.to(device), attention_mask=prefix_mask.to(device),
                         position_ids=prefix_pos.to(device), return_cache=True)
        owners = [i for i, e in enumerate(encs) for _ in e.branches]
        cache.reorder_cache(torch.tensor(owners, device=device))    # one copy of its state per question
        rows = [(e, b) for e in encs for b in e.branches]
        width = max(len(b.tokens) for _, b in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        pos = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), prefix_ids.shape[1] + width), dtype=torch.long)
        gather = []
        for r, ((e, b), owner) in enumerate(zip(rows, owners)):
            n, p = len(b.tokens), len(e.prefix)
            ids[r, :n] = torch.tensor(b.tokens)
            pos[r, :n] = torch.arange(p, p + n)
            mask[r, : prefix_ids.shape[1]] = prefix_mask[owner]
            mask[r, prefix_ids.shape[1]: prefix_ids.shape[1] + n] = 1
            gather += [r * width + i for i in b.readout]
        hidden = backbone(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                          cache=cache)
        padded = prefix_ids.numel() + ids.numel()
        return _gather(hidden, torch.tensor(gather, device=device)), padded

    @staticmethod
    def _prefixes(encs: list[Encoded], pad_id: int):
        width = max(len(e.prefix) for e in encs)
        ids = torch.full((len(encs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(encs), width), dtype=torch.long)
        pos = torch.zeros((len(encs), width), dtype=torch.long)
        for i, e in enumerate(encs):
            p = len(e.prefix)
            ids[i, width - p:] = torch.tensor(e.prefix)
            mask[i, width - p:] = 1
            pos[i, width - p:] = torch.arange(p)
        return ids, mask, pos
