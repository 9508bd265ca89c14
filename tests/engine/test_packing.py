"""Short requests share a packed row: each sees only itself, and answers stay those of rows.

pass_inputs.Packing lays groups (a prefix and its branches) into rows no
wider than the widest, first fit by decreasing length; masks.py keeps the
groups of a row apart. Checked here on the packing alone, on the mask it
gives, and through the engine, with the prefix cache off (PackedLayout) and
on (PackedReuse, where a state to keep leads its row and short states
continue the pinned head side by side), under CUDA's NaN for a row that
sees no key.
"""
import random

import pytest
import torch

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.masks import block_causal_mask, continued_block_causal_mask
from jevany_daemon.engine.pass_inputs import GROUP_SEGMENTS, PAD_SEGMENT, Packing, Upload
from jevany_daemon.engine.stream import Stream
from jevany_daemon.parity import compare

from .cuda_like import cuda_like_sdpa

PAD = 99


def _group(rng, n, base):
    """A group of n tokens: a prefix, then one or two branches; ids tell groups apart."""
    cut = rng.randint(0, n - 1)
    seg = [0] * cut + [1 + (i >= (cut + n) // 2) for i in range(cut, n)]
    return [base + i for i in range(n)], seg, list(range(n))


def test_groups_fill_rows_never_wider_than_the_widest_and_keep_their_tokens():
    rng = random.Random(3)
    packing, made = Packing(), []
    for g in range(40):
        n = rng.choice([rng.randint(3, 20), rng.randint(40, 60)])
        ids, seg, pos = _group(rng, n, 1000 * g)
        key = g % 3 if g % 5 else None
        leader = g % 7 == 0
        made.append((ids, seg, pos, key, leader))
        packing.add(ids, seg, pos, key=key, leader=leader)
    grid, placed, keys = packing.grid(PAD)
    width = max(len(ids) for ids, *_ in made)
    assert grid.width == width and len(grid.rows) < len(made)      # rows are shared, none wider
    at_column = {}
    for g, ((ids, seg, pos, key, leader), (r, at)) in enumerate(zip(made, placed)):
        row_ids, row_seg, row_pos = grid.rows[r]
        assert row_ids[at:at + len(ids)] == ids and row_pos[at:at + len(ids)] == pos
        assert keys[r] == key                          # only groups of one key share a row
        if leader:
            assert at == 0                             # a leader starts its row
        at_column.setdefault(r, []).append((at, g))
    for r, members in at_column.items():
        members.sort()
        for j, (at, g) in enumerate(members):
            # the j-th group's segments are offset by j groups; only the first of a row may lead it
            assert grid.rows[r][1][at:at + len(made[g][1])] == [s + j * GROUP_SEGMENTS for s in made[g][1]]
            assert j == 0 or not made[g][4]
        assert sum(len(made[g][0]) for _, g in members) == len(grid.rows[r][0])   # no gaps, no overlap


def test_the_groups_of_a_row_never_see_each_other():
    packing = Packing()
    packing.add([1, 2, 3, 4], [0, 0, 1, 2], [0, 1, 2, 2])      # prefix of 2, two branches
    packing.add([5, 6, 7], [0, 1, 1], [0, 1, 2])
    packing.add([8, 9, 10, 11, 12, 13, 14, 15], [0] * 3 + [1] * 5, list(range(8)))   # the width: 8
    grid, placed, _ = packing.grid(PAD)
    assert len(grid.rows) == 2 and placed[0][0] == placed[1][0]    # the short two share a row
    upload = Upload()
    sent = grid.register(upload)
    upload.send(Stream(torch.device("cpu")))
    allowed = block_causal_mask(sent.seg, torch.float32)[:, 0] == 0
    row = placed[0][0]
    first, second = (placed[0][1], 4), (placed[1][1], 3)
    sees = allowed[row]
    a, b = range(first[0], first[0] + 4), range(second[0], second[0] + 3)
    for i in a:
        assert not sees[i, list(b)].any()
    for i in b:
        assert not sees[i, list(a)].any()
    # within a group: the prefix, then its own branch only, causally
    f = first[0]
    assert sees[f + 2].nonzero().flatten().tolist() == [f, f + 1, f + 2]
    assert sees[f + 3].nonzero().flatten().tolist() == [f, f + 1, f + 3]
    # padding sees only padding, its diagonal included: no query without a key
    pads = [c for c, s in enumerate(sent.seg[row].tolist()) if s == PAD_SEGMENT]
    assert pads and all(sees[c, c] and not sees[c, :c][sent.seg[row, :c] >= 0].any() for c in pads)
    assert allowed.any(-1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_a_continued_mask_is_zero_where_allowed_and_the_lowest_float_elsewhere(dtype):
    # Built through the float's integer view (masks._additive): every entry must still be exactly
    # 0 or the dtype's lowest, in the dtype, and allow exactly what the rule says, checked here entry by entry.
    g = GROUP_SEGMENTS
    seg = torch.tensor([[0, 0, 1, 1, 2, g, g + 1, PAD_SEGMENT], [0, 1, 2, 3, PAD_SEGMENT, PAD_SEGMENT, PAD_SEGMENT,
                                                                  PAD_SEGMENT]])
    cached = torch.tensor([[0, 1, 1], [1, 1, 1]])
    mask = continued_block_causal_mask(cached, seg, dtype)
    assert mask.dtype == dtype and mask.shape == (2, 1, 8, 11)
    lowest = torch.finfo(dtype).min
    for b in range(2):
        for i in range(8):
            q = seg[b, i].item()
            for j in range(11):
                if j < 3:
                    expected = bool(cached[b, j])
                else:
                    k = seg[b, j - 3].item()
                    prefix = None if q == PAD_SEGMENT else q - q % g
                    expected = j - 3 <= i and (k == q or k == prefix)
                assert mask[b, 0, i, j].item() == (0.0 if expected else lowest), (b, i, j)


def _rows_per_pass(engine):
    real, rows = engine.passes.backbone, []

    def counting(**inputs):
        rows.append(inputs["input_ids"].shape[0])
        return real(**inputs)

    engine.passes.backbone = counting
    return rows


@pytest.mark.parametrize("cache", [0, 8])
def test_shared_rows_give_the_answers_of_rows(loaded_model, cache):
    model = loaded_model("qwen3", "choice")
    rows = Engine(model, EngineConfig(layout="rows", prefix_cache=0))
    rng = random.Random(5)
    # short one-question requests and a few long states, which the cache keeps (each leads its row)
    bodies = workloads.short(12, seed=5) + [workloads.request(rng, workloads._words_for(250), 2, structured=False)
                                          for _ in range(3)]
    expected = [rows.score([rows.admit(b)])[0] for b in bodies]
    engine = Engine(model, EngineConfig(layout="packed", prefix_cache=cache, prefix_min_tokens=200,
                                        batch_policy="greedy", max_padding_waste=1.0, max_batch_size=32,
                                        max_packed_tokens=1 << 16))
    seen_rows = _rows_per_pass(engine)
    for round_ in ("misses", "hits"):
        with cuda_like_sdpa() as seen:
            got = engine.score(engine.admit_many(bodies))
        report = compare(expected, got)
        assert report["max_abs_diff"] <= 1e-5 and not report["decisions_changed"], (round_, report)
        assert seen.dead_rows == 0
        assert seen_rows[-1] < len(bodies), (round_, seen_rows)          # requests really shared rows
    if cache:
        assert engine.prefix_cache.hits >= 3 and len(engine.prefix_cache) >= 3    # the long states were kept and reused


def test_a_state_to_keep_leads_its_row_so_its_keys_are_cut_whole(loaded_model):
    """A kept state (205 tokens to compute) fits beside a longer group that is not kept (355: a short
    state, four questions) within the widest (751); it must lead that row, where its keys are one span."""
    model = loaded_model("qwen3", "choice")
    rng = random.Random(5)
    widest = workloads.request(rng, workloads._words_for(650), 1, structured=False)
    kept = workloads.request(rng, workloads._words_for(180), 1, structured=False)
    many = workloads.request(rng, workloads._words_for(60), 4, instr_words=8, structured=False)
    bodies = [widest, kept, many]
    rows = Engine(model, EngineConfig(layout="rows", prefix_cache=0))
    expected = [rows.score([rows.admit(b)])[0] for b in bodies]
    engine = Engine(model, EngineConfig(prefix_cache=8, prefix_min_tokens=200, batch_policy="greedy",
                                        max_padding_waste=1.0, max_batch_size=32, max_packed_tokens=1 << 16))
    seen_rows = _rows_per_pass(engine)
    for round_ in ("misses", "hits"):
        report = compare(expected, engine.score(engine.admit_many(bodies)))
        assert report["max_abs_diff"] <= 1e-5 and not report["decisions_changed"], (round_, report)
    assert seen_rows[1] == 2 and engine.prefix_cache.hits == 2      # three groups in two rows; both kept states read back


def test_requests_continuing_one_kept_state_never_overrun_the_packed_token_bound(loaded_model):
    """Requests on one state pack into one row holding the state once and every question on it, and
    other requests' rows are padded to that width: batches are chosen on that cost, so no pass
    allocates more than --max-packed-tokens (one of 9 hits allocated 3,066 of 1,500 while requests
    were costed alone), and a pass's real tokens count the shared state once."""
    model = loaded_model("qwen3", "choice")
    rng = random.Random(2)
    state = workloads.request(rng, workloads._words_for(40), 1, structured=False)["state"]
    on_state = [{"state": state, "questions": workloads.request(rng, 1, 1, instr_words=40)["questions"]}
                for _ in range(10)]
    others = workloads.short(3, seed=4)
    bodies = others[:1] + on_state + others[1:]
    rows = Engine(model, EngineConfig(layout="rows", prefix_cache=0))
    expected = [rows.score([rows.admit(b)])[0] for b in bodies]
    limit = 1500
    engine = Engine(model, EngineConfig(prefix_cache=8, prefix_min_tokens=50, batch_policy="greedy",
                                        max_padding_waste=1.0, max_batch_size=32, max_packed_tokens=limit))
    engine.score(engine.admit_many(workloads.short(1, seed=9)))     # pins the prompt's head
    passes = []
    engine.observer = passes.append
    for round_ in ("misses", "hits"):               # the misses keep the state
        hits, before, passes[:] = engine.prefix_cache.hits, engine.stats.real_tokens, []
        admitted = engine.admit_many(bodies)
        stems = {a.encoded.stem for a in admitted}
        # what the passes compute: each distinct stem's uncached part once, then every question
        computed = sum(len(s) - engine.prefix_cache.peek(s) for s in stems) + sum(
            len(a.encoded.prefix) - len(a.encoded.stem) + len(b.tokens) for a in admitted for b in a.encoded.branches)
        got = engine.score(admitted)
        assert len(stems) == 4 and engine.stats.real_tokens - before == computed, round_   # 3 short, 1 shared
        assert all(p.padded_tokens <= limit for p in passes), (round_, passes)
        assert sum(p.size for p in passes) == len(bodies) and len(passes) > 1, round_
    assert engine.prefix_cache.hits > hits
    report = compare(expected, got)
    assert report["max_abs_diff"] <= 1e-5 and not report["decisions_changed"], report
