"""The batch-invariant kernels (model/invariant.py): each row's bits owe nothing to the rows beside it, and
the results stay those of torch's own kernels within FP32 rounding."""
import random

import pytest
import torch
import torch.nn.functional as F

from jevany_daemon.model.invariant import KEY_BLOCK, PIECE_ROWS, attention, round_width, rows_matmul


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
    q, k, v = _qkv([PIECE_ROWS], PIECE_ROWS)
    with pytest.raises(ValueError, match="mask"):
        attention(None, q, k, v, None)
