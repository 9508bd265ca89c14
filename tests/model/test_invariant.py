"""The batch-invariant kernels (model/invariant.py): each row's bits owe nothing to the rows beside it, and
the results stay those of torch's own kernels within FP32 rounding."""
import random

import pytest
import torch
import torch.nn.functional as F

from jevany_daemon.model.invariant import KEY_BLOCK, PIECE_ROWS, attention, block_attention, round_width, rows_matmul


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_product_is_the_same_whatever_rows_surround_it(dtype):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(384, 256, generator=gen).to(dtype).t()       # as a linear layer holds it
    mine = torch.randn(5, 256, generator=gen).to(dtype)
    alone = rows_matmul(mine, weight)
    rng = random.Random(1)
    for before, after in [(0, 0), (1, 0), (3, 40), (11, 300), (250, 7), (600, 600)]:
        before += rng.randint(0, 3)
        rows = torch.cat([torch.randn(before, 256, generator=gen).to(dtype), mine,
                          torch.randn(after, 256, generator=gen).to(dtype)])
        assert torch.equal(rows_matmul(rows, weight)[before: before + 5], alone), (before, after)
    torch.testing.assert_close(alone.float(), mine.float() @ weight.float(),
                               **({} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.02}))


def test_a_rows_product_keeps_the_leading_dimensions():
    a, b = torch.randn(3, 7, 64), torch.randn(64, 10)
    out = rows_matmul(a, b)
    assert out.shape == (3, 7, 10)
    torch.testing.assert_close(out, a @ b)


def _padded_causal(lengths, width):
    idx = torch.arange(width)
    real = torch.stack([idx < n for n in lengths])
    allowed = (real[:, None, :] | ~real[:, :, None]) & (idx[None, :] <= idx[:, None])
    return torch.zeros(len(lengths), 1, width, width).masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)


def _qkv(lengths, width, heads=4, kv_heads=2, dim=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(len(lengths), heads, width, dim, generator=gen)
    k = torch.randn(len(lengths), kv_heads, width, dim, generator=gen)
    v = torch.randn(len(lengths), kv_heads, width, dim, generator=gen)
    return q, k, v


def test_attention_is_sdpas_within_rounding():
    lengths = [5, 70, 200, 131]
    q, k, v = _qkv(lengths, 200)
    mask = _padded_causal(lengths, 200)
    out, weights = attention(None, q, k, v, mask, scaling=0.2)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask,
                                         scale=0.2).transpose(1, 2)
    assert weights is None and out.shape == (4, 200, 4, 32)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out[b, :n], ref[b, :n], atol=1e-6, rtol=1e-5)


def test_a_rows_attention_is_the_same_padded_wider_and_beside_other_rows():
    n = 14 * KEY_BLOCK + 4                 # keys in fifteen blocks, the last partly real (SDPA moves here)
    q, k, v = _qkv([n], round_width(n), seed=1)
    alone = attention(None, q, k, v, _padded_causal([n], round_width(n)))[0][0, :n]
    for width, at, others in [(round_width(n) + KEY_BLOCK, 0, 0), (1536, 2, 3), (round_width(n), 1, 2)]:
        lengths = [width - 7 * i for i in range(others + 1)]
        lengths[at] = n
        bq, bk, bv = _qkv(lengths, width, seed=2)
        bq[at], bk[at], bv[at] = 0, 0, 0
        bq[at, :, :round_width(n)], bk[at, :, :round_width(n)], bv[at, :, :round_width(n)] = q[0], k[0], v[0]
        out = attention(None, bq, bk, bv, _padded_causal(lengths, width))[0]
        assert torch.equal(out[at, :n], alone), (width, at, others)


def test_attention_refuses_to_guess_a_mask():
    q, k, v = _qkv([32], 32)
    with pytest.raises(ValueError, match="mask"):
        attention(None, q, k, v, None)


def _runs_of(lengths):
    """What the layouts hand the attention: rows by rounded width, (width, rows) per run."""
    widths = sorted(round_width(n) for n in lengths)
    return tuple((w, widths.count(w)) for w in dict.fromkeys(widths))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_runs_of_rows_are_each_computed_at_their_own_width_in_a_grid_and_end_to_end(dtype):
    """A row's bits the same alone (one run, at its own width), among rows of a grid padded wider, and end to
    end with others in one sequence (the flat layout); and SDPA's within rounding."""
    rng = random.Random(3)
    lengths = sorted(rng.randint(3, 700) for _ in range(9))
    runs, width = _runs_of(lengths), round_width(max(lengths))
    q, k, v = (x.to(dtype) for x in _qkv(lengths, width, seed=4))
    grid = attention(None, q, k, v, None, scaling=0.2, grid_runs=runs)[0]          # [B, width, H, D]

    def cut(x, b):          # row b at its own width, as one row of its own
        return x[b: b + 1, :, :round_width(lengths[b])]
    flat = attention(None, *(torch.cat([cut(x, b) for b in range(len(lengths))], 2) for x in (q, k, v)), None,
                     scaling=0.2, flat_runs=runs)[0]                                # [1, sum of widths, H, D]
    at = 0
    for b, n in enumerate(lengths):
        w = round_width(n)
        alone = attention(None, cut(q, b), cut(k, b), cut(v, b), None, scaling=0.2, grid_runs=((w, 1),))[0][0, :n]
        assert torch.equal(grid[b, :n], alone) and torch.equal(flat[0, at: at + n], alone), (b, n)
        assert not grid[b, w:].any()          # a grid's padding past the row's own width: zeros
        ref = F.scaled_dot_product_attention(q[b: b + 1].float(), k[b: b + 1].float().repeat_interleave(2, 1),
                                             v[b: b + 1].float().repeat_interleave(2, 1), is_causal=True, scale=0.2)
        torch.testing.assert_close(alone.float(), ref[0].transpose(0, 1)[:n],
                                   **({} if dtype == torch.float32 else {"atol": 0.02, "rtol": 0.02}))
        at += w


def test_the_blocks_under_a_causal_mask_of_one_width_are_sdpa_within_rounding():
    """What a run is computed with off a CPU: the blocks, under a causal mask broadcast over its rows."""
    q, k, v = _qkv([200, 200, 200], 224, heads=4, kv_heads=4)
    causal = torch.full((224, 224), torch.finfo(torch.float32).min).triu_(1)[None, None]
    out = block_attention(q, k, v, causal, 0.2)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2),
                               atol=1e-6, rtol=1e-5)
