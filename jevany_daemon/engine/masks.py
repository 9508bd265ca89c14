"""Attention masks in which every query row may attend to at least one key.

CUDA's memory-efficient SDPA kernel returns NaN for a query row that may
attend to nothing (the CPU kernel returns zeros, which hides the problem), and
transformers no longer repairs such rows. A NaN at a padded position then
spreads into real tokens: through later attention layers (a masked value is
multiplied by a zero weight, and 0 x NaN is NaN) and through a recurrence.
So padded positions always keep their own diagonal: they attend to
themselves (and may attend to more), produce finite garbage that no real
token ever reads, and real rows are unchanged.

Hybrid models need a mask per layer type: attention layers take the 4D
additive mask, linear-attention (recurrent) layers the 2D padding mask,
which zeroes padded inputs so they leave the recurrent state alone.
"""
import torch

from .pass_inputs import GROUP_SEGMENTS

# Layer types that read a 4D attention mask, and those that read 2D padding.
ATTENTION_LAYERS = frozenset({"full_attention"})
RECURRENT_LAYERS = frozenset({"linear_attention", "conv"})


# Each float dtype's integer twin, for building an additive mask through its bit pattern (_additive).
_SAME_WIDTH_INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
                   torch.float64: torch.int64}


def _lowest_bits_of(dtype: torch.dtype) -> int:
    """The bit pattern of dtype's lowest finite value, read as its integer twin (a CPU scalar)."""
    return torch.tensor(torch.finfo(dtype).min, dtype=dtype).view(_SAME_WIDTH_INT[dtype]).item()


# Read once, at import: a mask built inside a compiled or captured forward finds a constant here,
# never a scalar read (which would break torch.compile's graph and sync a device).
_LOWEST_BITS = {dtype: _lowest_bits_of(dtype) for dtype in _SAME_WIDTH_INT}


def _additive(allowed: torch.Tensor, dtype: torch.dtype, cached: torch.Tensor | None = None) -> torch.Tensor:
    """[B,L,L] allowed → [B,1,L,L] additive float mask (never boolean: see layouts.py).

    With cached [B,W] (bool), the keys of a continued cache come first: [B,1,L,W+L], every query of
    a row seeing the row's cached keys. Written in one pass through the integer view of the float:
    0 where allowed (the bits of +0.0), the lowest float's bits elsewhere. On a CPU that is half the
    time of filling a float tensor by mask (a pass of 32 requests builds a million entries); on a
    device it is one kernel more, a few per pass whatever the depth.
    """
    if cached is not None:
        allowed = torch.cat([cached[:, None, :].expand(-1, allowed.shape[1], -1), allowed], dim=2)
    twin = _SAME_WIDTH_INT.get(dtype)
    if twin is None:         # a dtype with no integer twin here: filled by mask
        return torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype,
                          device=allowed.device).masked_fill_(allowed, 0)[:, None]
    return (~allowed).to(twin).mul_(_LOWEST_BITS[dtype]).view(dtype)[:, None]


def _causal(width: int, device) -> torch.Tensor:
    idx = torch.arange(width, device=device)
    return idx[None, :] <= idx[:, None]


def padded_causal_mask(padding: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B,L] 0/1 padding → additive [B,1,L,L]: a real query sees the real keys before it; a padded
    query sees every key before it, so it has its diagonal wherever the padding lies."""
    real = padding.bool()
    allowed = real[:, None, :] | ~real[:, :, None]
    allowed &= _causal(padding.shape[1], padding.device)
    return _additive(allowed, dtype)


def _block_causal(seg: torch.Tensor) -> torch.Tensor:
    """i sees j iff j <= i and j is in i's own segment or is its group's prefix (i's segment rounded
    down to a multiple of GROUP_SEGMENTS: pass_inputs.Packing). Padding (-1) is a segment of its own
    with no prefix: a padded query sees padding before it and its diagonal, a real one never sees
    padding, nor another group."""
    key, query = seg[:, None, :], seg[:, :, None]
    prefix = query - torch.remainder(query, GROUP_SEGMENTS)    # -1 rounds down to -GROUP_SEGMENTS: no key
    allowed = (key == query) | (key == prefix)
    allowed &= _causal(seg.shape[1], seg.device)
    return allowed


def block_causal_mask(seg: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [B,1,L,L] mask over packed rows; seg marks each group's prefix (j * GROUP_SEGMENTS),
    its branches (j * GROUP_SEGMENTS + 1..) and padding (-1)."""
    return _additive(_block_causal(seg), dtype)


def continued_block_causal_mask(cached: torch.Tensor, seg: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """block_causal_mask for a pass that continues a cache: additive [B,1,L,W+L].

    cached [B,W] 0/1 marks each row's cached keys (left-padded); every query sees all of its row's
    (a padded one too: what it computes is never read, and it has its diagonal anyway).
    """
    return _additive(_block_causal(seg), dtype, cached.bool())


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
