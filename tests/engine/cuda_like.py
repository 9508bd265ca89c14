"""CUDA's attention behaviour, reproduced on the CPU.

On CUDA, SDPA's memory-efficient kernel returns NaN for a query row that may
attend to no key at all; the CPU kernel returns zeros (or, for an additive
mask of finfo.min, a plain average) and so hides the bug. Inside
``cuda_like_sdpa()`` every such row comes out NaN, as the GPU would give it.
A row counts as attending to nothing when every key is False in a boolean
mask, or at most finfo.min / 2 (blocked) in an additive one: stricter than
any one kernel, so a layout that passes here is safe on all of them.
"""
import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Emulation:
    calls: int = 0
    dead_rows: int = 0      # query rows that had no allowed key, turned to NaN


def dead_rows(mask: torch.Tensor) -> torch.Tensor:
    """[..., Q] True where a query row of the mask allows no key."""
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return ~allowed.any(-1)


@contextlib.contextmanager
def cuda_like_sdpa():
    original = F.scaled_dot_product_attention
    seen = Emulation()

    def sdpa(query, key, value, attn_mask=None, *args, **kwargs):
        out = original(query, key, value, attn_mask, *args, **kwargs)
        seen.calls += 1
        if attn_mask is None:
            return out
        dead = dead_rows(attn_mask)                     # [B, 1 or H, Q]
        seen.dead_rows += int(dead.sum())
        return out.masked_fill(dead[..., None], float("nan"))

    # transformers looks the function up on torch.nn.functional at every call.
    F.scaled_dot_product_attention = sdpa
    try:
        yield seen
    finally:
        F.scaled_dot_product_attention = original
