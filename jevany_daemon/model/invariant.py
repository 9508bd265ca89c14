"""Batch-invariant kernels: each row's result computed in an order no other row of its pass can change.

With them (``make_batch_invariant``) a request's probabilities are the same to
the last bit alone or in any pass, at any place in it. Each replaces an op
whose order of operations follows the shape of the whole pass; measured on a
CPU (torch 2.13, FP32 and BF16, two threads; docs/SERVING.md#batch-invariant-answers):

- **Products** (every linear layer, the readouts' label rows): a BLAS picks
  its kernel, its blocking and its threads' split by the whole product's
  shape. FP32 rows of a product of at most 8 rows differ in their last bits
  from the same rows among 16 or more, and big shapes (1024 x 3584) differ
  between products of 16 and of 256 rows or more (BF16: of 48 or more). A
  batched product (bmm) of fixed pieces is no cure past 16-row pieces (its
  threads split pieces of 64 rows otherwise by their count) and runs pieces
  that small at a fraction of the speed. Here a product runs as products of
  exactly PIECE_ROWS rows, one after another (the last padded with zeros):
  the same shape every time, whatever the pass, and a row's bits do not
  depend on where in its piece it sits (0 of 320 tries at random offsets:
  benchmarks/invariant_probe.py).
- **Attention**: torch's SDPA blocks its queries and keys by the width they
  are padded to, so a row padded wider may sum its softmax in another order
  (FP32 rows of 500 to 1,500 tokens padded to other widths: 3 to 5 of 12
  differed), but it computes every row and head apart from the others. The
  layouts hand it runs of rows padded alone to one rounded width
  (engine/layouts.py: a grid's, or rows end to end), and each run goes
  through SDPA cut to its own width (run_attention). Off a CPU, a run goes
  through blocks of KEY_BLOCK keys with an online softmax instead (a block
  the mask hides entirely changes nothing: its weights are exact zeros).
- **Widths** are rounded to WIDTH_MULTIPLE tokens, and elementwise ops are
  left as torch runs them: its vectorised loops compute the elements past the
  last whole vector with scalar code, whose exp and sigmoid may round
  otherwise. A hybrid layer's gates ([tokens, 4]) put a different token there
  in every pass, and the short convolution of its Gated DeltaNet layers
  differed at widths of 37 and 90 tokens; with widths rounded, both are
  invariant as torch runs them (0 of 120 convolutions differed), and so is
  the chunked delta rule. Rounded widths also gather rows into few runs.
- **Left as they are**, measured invariant: normalisations, rotary
  positions, embeddings, the pointer readout's softmax over a pass's padded
  options.

Pieces are padded on the way in and cut on the way out; nothing here reads a
device value, so a pass stays one queue of kernels.
"""
import types

import torch
import torch.nn.functional as F

PIECE_ROWS = 256      # rows of every product: its shape whatever the pass (the cost of padding a lone request)
KEY_BLOCK = 64        # keys attention reads at a time
WIDTH_MULTIPLE = 32   # tokens rows are rounded to: two AVX-512 vectors of FP32, four of AVX2
ATTENTION = "jevany_batch_invariant"    # the attention implementation's name, as transformers registers it


def round_width(width: int) -> int:
    """A row's (or a grid's) width, rounded up to WIDTH_MULTIPLE."""
    return -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE


def rows_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [..., K] @ b [K, N], each row of a through the same product of PIECE_ROWS rows (the last piece
    padded with zeros), one product at a time."""
    lead, k = a.shape[:-1], a.shape[-1]
    rows = a.reshape(-1, k)
    m, whole = rows.shape[0], rows.shape[0] // PIECE_ROWS * PIECE_ROWS
    out = rows.new_empty((-(-m // PIECE_ROWS) * PIECE_ROWS, b.shape[1]))
    for at in range(0, whole, PIECE_ROWS):
        torch.mm(rows[at: at + PIECE_ROWS], b, out=out[at: at + PIECE_ROWS])
    if whole < m:
        last = rows.new_zeros((PIECE_ROWS, k))
        last[: m - whole] = rows[whole:]
        torch.mm(last, b, out=out[whole:])
    return out[:m].view(*lead, -1)


def _linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    y = rows_matmul(x, self.weight.t())
    return y if self.bias is None else y + self.bias


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, grid_runs=None, flat_runs=None,
              run_masks=None, **kwargs):
    """transformers' attention interface: query [B, H, L, D], key and value [B, Hkv, L, D] → ([B, L, H, D], no
    weights).

    From the batch-invariant layouts (engine/layouts.py), the runs of their rows: (width, rows) of each run
    of rows padded alone to one width, after their tokens. grid_runs: rows of the grid, [B, L], causal
    their mask; flat_runs: rows end to end in one sequence, [1, L], with run_masks, each run's additive
    [rows, 1, width, width]. Each run is computed alone at its own width (run_attention). Without runs:
    the blocks below, under the rows layout's additive mask [B, 1, L, L]."""
    if key.shape[2] != query.shape[2]:
        raise ValueError("batch-invariant attention reads a pass's own keys only, never a kept cache's")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    if grid_runs is not None:
        return run_attention(query, key, value, scale, grid_runs, flat=False), None
    if flat_runs is not None:
        return run_attention(query, key, value, scale, flat_runs, flat=True, masks=run_masks), None
    if attention_mask is None:
        raise ValueError("batch-invariant attention needs the layouts' runs or their explicit mask")
    return block_attention(query, key, value, attention_mask, scale).transpose(1, 2).contiguous(), None


def _run_views(x: torch.Tensor, runs, flat: bool):
    """[rows, heads, width, D] views of x [B, heads, L, D], one per run."""
    at = 0
    for width, rows in runs:
        if flat:
            yield x[0, :, at: at + rows * width].unflatten(1, (rows, width)).transpose(0, 1)
            at += rows * width
        else:
            yield x[at: at + rows, :, :width]
            at += rows


def run_attention(query, key, value, scale: float, runs, flat: bool, masks=None) -> torch.Tensor:
    """Each run of rows alone, at its own width. On a CPU, torch's SDPA: its kernel blocks queries and keys
    by the width alone and computes each row and head apart from the others (0 of 420 rows of 3 to 1,200
    tokens differed, FP32 and BF16, beside 0 to 11 others of their width: benchmarks/invariant_probe.py).
    Elsewhere, the blocks below: whether a GPU's SDPA kernels split their work by the number of rows is
    unmeasured. Each run is causal, or under its mask (masks: one per run). Positions past the runs' own
    widths (a grid's padding) are zeros, which no reader reads."""
    out = query.new_zeros(query.shape)
    repeat = query.shape[1] // key.shape[1]
    views = zip(*(_run_views(x, runs, flat) for x in (query, key, value, out)), masks or [None] * len(runs))
    for q, k, v, o, mask in views:
        if repeat > 1:        # grouped-query attention: query head h reads key head h // repeat
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        if q.device.type == "cpu":
            o.copy_(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale))
            continue
        if mask is None:
            width = q.shape[2]
            mask = torch.full((width, width), torch.finfo(torch.float32).min, device=q.device).triu_(1)[None, None]
        o.copy_(block_attention(q, k, v, mask, scale))
    return out.transpose(1, 2).contiguous()


def block_attention(query, key, value, attention_mask, scale: float) -> torch.Tensor:
    """[B, H, L, D] under an additive mask [B or 1, 1, L, L]. Keys in blocks of KEY_BLOCK with an online
    softmax, FP32 inside: a block the mask hides entirely changes nothing, so a row padded wider, or beside
    longer rows, gets the same bits on any device.

    Computed transposed, queries as columns: every product has KEY_BLOCK or D+1 rows and a reduction
    of D or KEY_BLOCK, whatever the pass; only the number of columns (queries) follows its width.
    """
    dtype = query.dtype
    batch, heads, length, dim = query.shape
    repeat = heads // key.shape[1]
    if repeat > 1:        # grouped-query attention: query head h reads key head h // repeat
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    width = key.shape[2]
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
    return (acc[:, :dim] / acc[:, dim:]).view(batch, heads, dim, length).transpose(2, 3).to(dtype)


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
