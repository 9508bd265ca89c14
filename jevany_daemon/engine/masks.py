"""Attention masks in which every query row may attend to at least one key.

CUDA's memory-efficient SDPA kernel returns NaN for a query row that may
attend to nothing (the CPU kernel returns zeros, which hides the problem), and
transformers no longer repairs such rows. A NaN at a padded position then
spreads into real tokens: through later attention layers (a masked value is
multiplied by a zero weight, and 0 x NaN is NaN) and through a recurrence.
So padded positions always keep their own diagonal: they attend to
themselves, produce finite garbage that no real token ever reads, and real
rows are unchanged.

Hybrid models need a mask per layer type: attention layers take the 4D
additive mask, linear-attention (recurrent) layers the 2D padding mask,
which zeroes padded inputs so they leave the recurrent state alone.
"""
import torch

# Layer types that read a 4D attention mask, and those that read 2D padding.
ATTENTION_LAYERS = frozenset({"full_attention"})
RECURRENT_LAYERS = frozenset({"linear_attention", "conv"})


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B,L,L] allowed → [B,1,L,L] additive float mask (never boolean: see layouts.py)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def _with_diagonal(allowed: torch.Tensor) -> torch.Tensor:
    width = allowed.shape[-1]
    return allowed | torch.eye(width, dtype=torch.bool, device=allowed.device)


def padded_causal_mask(padding: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B,L] 0/1 padding → additive [B,1,L,L]: causal over real keys, plus every diagonal."""
    width = padding.shape[1]
    idx = torch.arange(width, device=padding.device)
    causal = idx[None, :] <= idx[:, None]
    allowed = causal[None] & padding.bool()[:, None, :]
    return _additive(_with_diagonal(allowed), dtype)


def block_causal_mask(seg: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [B,1,L,L] mask: i sees j iff j <= i and j is prefix (0) or in i's own branch; -1 is padding."""
    width = seg.shape[1]
    idx = torch.arange(width, device=seg.device)
    causal = idx[None, :] <= idx[:, None]
    key, query = seg[:, None, :], seg[:, :, None]
    allowed = causal & (key >= 0) & ((key == 0) | (key == query))
    return _additive(_with_diagonal(allowed), dtype)


def continued_block_causal_mask(cached: torch.Tensor, seg: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """block_causal_mask for a pass that continues a cache: additive [B,1,L,W+L].

    cached [B,W] 0/1 marks each row's cached keys (left-padded); every real
    query sees all of its row's, a padded query none (it has its diagonal).
    """
    width = seg.shape[1]
    idx = torch.arange(width, device=seg.device)
    causal = idx[None, :] <= idx[:, None]
    key, query = seg[:, None, :], seg[:, :, None]
    branches = _with_diagonal(causal & (key >= 0) & ((key == 0) | (key == query)))
    sees_cached = cached.bool()[:, None, :] & (seg >= 0)[:, :, None]
    return _additive(torch.cat([sees_cached, branches], dim=2), dtype)


def per_layer_type(layer_types, attention: torch.Tensor, padding: torch.Tensor | None):
    """What the decoder takes as attention_mask: the 4D mask alone, or a mapping by layer type.

    transformers builds its own masks unless it is handed a mapping, and a
    recurrent layer cannot read a 4D mask, so hybrid models get a mapping.
    """
    kinds = set(layer_types or ())
    if not kinds - ATTENTION_LAYERS:
        return attention
    unknown = kinds - ATTENTION_LAYERS - RECURRENT_LAYERS
    if unknown:
        # A sliding-window layer, say, would need its window in the mask; no layout is proven there.
        raise ValueError(f"no custom attention mask for layer types {sorted(unknown)}")
    return {kind: attention if kind in ATTENTION_LAYERS else padding for kind in kinds}
