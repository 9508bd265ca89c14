"""How encoded requests become one forward pass: rows or packed.

Rows: one causal row per question (shared prefix + branch), right-padded.
Exact on every architecture, recurrent layers included, because padding only
ever follows the real tokens.

Packed: one sequence per request (prefix once, then every branch) under a
block-causal 4D mask with positions restarting after the prefix. It runs the
shared state once, but it is only valid where a test proves it equals rows.
The mask is additive float, never boolean: eager attention silently
misreads boolean 4D masks in the transformers version we pin.
"""
from dataclasses import dataclass

import torch

from .prompts import Encoded

# Architectures whose packed layout a test proves equal to rows
# (tests/engine/test_parity.py). Hybrid recurrent models can never pack.
PACKED_PROVEN = frozenset({"qwen3"})


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None
    gather: torch.Tensor          # flat indices into [N*L] of every readout position, request by request
    padded_tokens: int


class RowsLayout:
    name = "rows"

    @staticmethod
    def shape(enc: Encoded) -> tuple[int, int]:
        """(rows, width) this request occupies; a batch costs sum(rows) * max(width) tokens."""
        return len(enc.branches), max(enc.row_lengths)

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


class PackedLayout:
    name = "packed"

    @staticmethod
    def shape(enc: Encoded) -> tuple[int, int]:
        return 1, enc.packed_length

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


def padded_cost(shapes: list[tuple[int, int]]) -> int:
    return sum(h for h, _ in shapes) * max(w for _, w in shapes)
