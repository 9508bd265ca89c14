"""Batch-invariant kernels: each row's result computed in an order no other row of its pass can change.

With them (``make_batch_invariant``) a request's probabilities are the same to
the last bit alone or in any pass, at any place in it. Each replaces an op
whose order of operations follows the shape of the whole pass; measured on a
CPU (torch 2.13, FP32 and BF16; docs/SERVING.md#batch-invariant-answers):

- **Products** (every linear layer, the readouts' label rows): a BLAS picks
  its kernel by the number of rows. FP32 rows of a product of at most 8 rows
  differ in their last bits from the same rows in a product of 16 or more,
  and two threads split a big product one way or another by its rows. Here a
  product runs as a batch of pieces of PIECE_ROWS rows each (the last padded
  with zeros): every piece is the same small product, whatever the pass.
- **Attention**: torch's SDPA blocks its queries and keys by the width they
  are padded to, so a row padded wider may sum its softmax in another order
  (FP32 rows of 500 to 1,500 tokens padded to other widths: 3 to 5 of 12
  differed). Here keys go in blocks of KEY_BLOCK, one after another, with an
  online softmax: a block the mask hides entirely changes nothing (its
  weights are exact zeros), so a row padded wider, or beside longer rows,
  gets the same bits.
- **Widths** are rounded to WIDTH_MULTIPLE tokens (layouts.RowsLayout), and
  elementwise ops are left as torch runs them: its vectorised loops compute
  the elements past the last whole vector with scalar code, whose exp and
  sigmoid may round otherwise. A hybrid layer's gates ([tokens, 4]) put a
  different token there in every pass, and the short convolution of its
  Gated DeltaNet layers differed at widths of 37 and 90 tokens; with widths
  rounded, both are invariant as torch runs them (0 of 120 convolutions
  differed), and so is the chunked delta rule.
- **Left as they are**, measured invariant: normalisations, rotary
  positions, embeddings, the pointer readout's softmax over a pass's padded
  options.

Keys and pieces are padded on the way in and cut on the way out; nothing
here reads a device value, so a pass stays one queue of kernels.
"""
import types

import torch
import torch.nn.functional as F

PIECE_ROWS = 16       # rows of every product's pieces: each piece one small product, whatever the pass
KEY_BLOCK = 64        # keys attention reads at a time
WIDTH_MULTIPLE = 32   # tokens a pass's rows are rounded to: two AVX-512 vectors of FP32, four of AVX2
ATTENTION = "jevany_batch_invariant"    # the attention implementation's name, as transformers registers it


def round_width(width: int) -> int:
    """A pass's width, rounded up to WIDTH_MULTIPLE."""
    return -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE


def rows_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [..., K] @ b [K, N], each row of a through the same product of PIECE_ROWS rows."""
    lead, k = a.shape[:-1], a.shape[-1]
    flat = a.reshape(-1, k)
    m = flat.shape[0]
    pieces = -(-m // PIECE_ROWS)
    if pieces * PIECE_ROWS != m:
        flat = torch.cat([flat, flat.new_zeros(pieces * PIECE_ROWS - m, k)])
    out = torch.bmm(flat.view(pieces, PIECE_ROWS, k), b.expand(pieces, *b.shape))
    return out.view(pieces * PIECE_ROWS, -1)[:m].view(*lead, -1)


def _linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    y = rows_matmul(x, self.weight.t())
    return y if self.bias is None else y + self.bias


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface: query [B, H, L, D], key and value [B, Hkv, L, D], a causal additive
    mask [B, 1, L, L] (the rows layout's: no query sees a key after it) → ([B, L, H, D], no weights). FP32
    inside.

    Computed transposed, queries as columns: every product has KEY_BLOCK or D+1 rows and a reduction
    of D or KEY_BLOCK, whatever the pass; only the number of columns (queries) follows its width.
    """
    if attention_mask is None:
        raise ValueError("batch-invariant attention needs the layouts' explicit mask")
    dtype = query.dtype
    batch, heads, length, dim = query.shape
    repeat = heads // key.shape[1]
    if repeat > 1:        # grouped-query attention: query head h reads key head h // repeat
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    width = key.shape[2]
    if width != length:
        raise ValueError("batch-invariant attention reads a pass's own keys only, never a kept cache's")
    scale = dim ** -0.5 if scaling is None else scaling
    blocks = -(-width // KEY_BLOCK)
    lowest = torch.finfo(torch.float32).min
    columns = (query.float() * scale).reshape(batch * heads, length, dim).transpose(1, 2)     # [BH, D, L]
    k = F.pad(key.float(), (0, 0, 0, blocks * KEY_BLOCK - width)).reshape(batch * heads, -1, dim)
    # A row of ones under the values: the product that weighs them sums the weights too.
    v = F.pad(value.float(), (0, 1, 0, blocks * KEY_BLOCK - width), value=1.0).reshape(batch * heads, -1, dim + 1)
    mask = F.pad(attention_mask.float(), (0, blocks * KEY_BLOCK - width), value=lowest).transpose(-1, -2)  # [B,1,W,L]
    peak = columns.new_full((batch * heads, 1, length), lowest)
    acc = columns.new_zeros((batch * heads, dim + 1, length))
    for j in range(blocks):
        keys, seen = slice(j * KEY_BLOCK, (j + 1) * KEY_BLOCK), slice(j * KEY_BLOCK, None)
        # Causal: a query before the block sees none of its keys, and the block would leave its sums exactly
        # as they are (weights exp(lowest - peak) = 0), so only the queries from the block's first key on read it.
        scores = torch.bmm(k[:, keys], columns[:, :, seen]).view(batch, heads, KEY_BLOCK, -1)
        scores = (scores + mask[:, :, keys, seen]).view(batch * heads, KEY_BLOCK, -1)     # [BH, KEY_BLOCK, L']
        new = torch.maximum(peak[:, :, seen], scores.amax(1, keepdim=True))
        # the first block: acc is 0, and exp(lowest - new) is 0 or, where nothing was seen yet, 1 times 0
        weighed = torch.bmm(v[:, keys].transpose(1, 2), (scores - new).exp())
        acc[:, :, seen] = acc[:, :, seen] * (peak[:, :, seen] - new).exp() + weighed
        peak[:, :, seen] = new
    out = (acc[:, :dim] / acc[:, dim:]).view(batch, heads, dim, length)
    return out.permute(0, 3, 1, 2).contiguous().to(dtype), None


def make_batch_invariant(model) -> None:
    """Serve a loaded DecisionModel with the kernels above, for good: its linear layers (backbone and
    head) and its attention. Idempotent."""
    from transformers import AttentionInterface

    roots = [model.causal_lm] + ([model.head] if model.head is not None else [])
    for root in roots:
        for module in root.modules():
            if isinstance(module, torch.nn.Linear):
                module.forward = types.MethodType(_linear_forward, module)
    AttentionInterface.register(ATTENTION, attention)
    model.causal_lm.set_attn_implementation(ATTENTION)
