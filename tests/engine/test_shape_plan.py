"""The shape plan: its ladders, which bucket a pass is padded to, and that every pass in bounds has one."""
import math
import random
from collections import deque

import pytest

from jevany_daemon.engine.batching import BatchLimits, Pending, take_batch
from jevany_daemon.engine.shape_plan import ROWS_PER_REQUEST, WIDTH_GRANULE, Bucket, ShapePlan, ladder


def test_ladders_grow_by_their_step_and_end_at_their_bound():
    rows = ladder(1, 128, 2)
    assert rows[:8] == (1, 2, 3, 4, 6, 8, 12, 16) and rows[-1] == 128
    widths = ladder(16, 8192, 4, 16)
    assert widths[:9] == (16, 32, 48, 64, 80, 96, 112, 128, 160) and widths[-1] == 8192
    assert all(w % 16 == 0 for w in widths)
    for values, step, granule in ((rows, 2, 1), (widths, 4, 16)):
        assert list(values) == sorted(set(values))
        # Beyond the first few (where rounding up to a whole granule dominates), about 2**(1/step) apart.
        ratios = [b / a for a, b in zip(values, values[1:]) if a >= 8 * granule]
        assert max(ratios) <= 2 ** (1 / step) * 1.08
    assert ladder(16, 1000, 4, 16)[-1] == 1000       # a bound off the ladder is its last value


def test_fit_is_the_smallest_bucket_holding_the_pass_and_none_past_the_plan():
    plan = ShapePlan(max_rows=64, max_width=4096, max_tokens=8192, cached=68)
    assert plan.fit(1, 1) == Bucket(1, 16)
    assert plan.fit(28, 170) == Bucket(32, 192)
    assert plan.fit(5, 129) == Bucket(6, 160)
    assert plan.fit(65, 16) is None                   # more rows than the plan holds
    assert plan.fit(1, 4097) is None                  # wider than the window
    assert plan.fit(40, 200) is None                  # 48 x 224 is more tokens than a pass may hold
    assert plan.tokens(28, 170) == 32 * 192
    assert plan.tokens(40, 200) == math.inf           # a batch never grows out of the plan
    assert all(b.tokens <= 8192 for b in plan.buckets)
    assert plan.describe()["cached"] == 68 and plan.describe()["buckets"] == len(plan)


def test_every_pass_a_bucket_can_hold_has_one_and_it_is_the_cheapest():
    plan = ShapePlan.for_engine(max_batch_size=8, max_tokens=2048, window=4096, cached=0)
    assert max(plan.rows) == 8 * ROWS_PER_REQUEST and max(plan.widths) == 2048
    rng = random.Random(0)
    for _ in range(2000):
        n, w = rng.randint(1, 40), rng.randint(1, 2100)
        bucket = plan.fit(n, w)
        holding = [b for b in plan.buckets if b.rows >= n and b.width >= w]
        if not holding:
            assert bucket is None
            continue
        assert bucket in plan and bucket.rows >= n and bucket.width >= w
        assert bucket.tokens == min(b.tokens for b in holding)
        # Padding a dimension costs at most one step of its ladder.
        assert bucket.width <= max(WIDTH_GRANULE * math.ceil(w / WIDTH_GRANULE), w * 2 ** 0.25 + WIDTH_GRANULE)
        assert bucket.rows <= max(n + 1, math.ceil(n * 2 ** 0.5))


def _pending(rows, width, real=None):
    return Pending(item=None, rows=rows, width=width, real=real if real is not None else rows * width)


def test_a_priced_batch_never_grows_out_of_the_plan():
    plan = ShapePlan(max_rows=64, max_width=4096, max_tokens=2048)
    # Own tokens: 4 rows of 300 = 1200, under the 2048 a pass may hold. But 4 x 300 pads to 4 x 320 = 1280, and
    # a fifth row to 6 x 320 = 1920; a sixth would need 6 x 320 too, a seventh 8 x 320 = 2560: past the plan.
    queue = deque(_pending(1, 300) for _ in range(10))
    unpriced = take_batch(queue, BatchLimits(32, 2048, 1.0))
    assert len(unpriced) == 6                         # 6 x 300 = 1800 <= 2048 < 7 x 300
    queue = deque(_pending(1, 300) for _ in range(10))
    priced = take_batch(queue, BatchLimits(32, 2048, 1.0, price=plan.tokens))
    assert len(priced) == 6 and plan.fit(len(priced), 300) == Bucket(6, 320)
    queue = deque(_pending(1, 330) for _ in range(10))     # 6 x 352 = 2112: a sixth request leaves the plan
    assert len(take_batch(queue, BatchLimits(32, 2048, 1.0, price=plan.tokens))) == 4
    # A request no bucket holds still runs, alone.
    queue = deque([_pending(1, 5000), _pending(1, 10)])
    assert len(take_batch(queue, BatchLimits(32, 8192, 1.0, price=plan.tokens))) == 1


@pytest.mark.parametrize("max_tokens", [64, 256, 8192])
def test_no_bucket_holds_more_than_a_pass_may(max_tokens):
    plan = ShapePlan.for_engine(max_batch_size=32, max_tokens=max_tokens, window=32768, cached=0)
    assert plan.buckets and all(b.tokens <= max_tokens for b in plan.buckets)
    assert Bucket(1, WIDTH_GRANULE) in plan


def test_packed_rows_fill_the_width_whose_bucket_holds_fewest_tokens():
    from jevany_daemon.engine.pass_inputs import Packing

    plan = ShapePlan(max_rows=64, max_width=4096, max_tokens=8192)
    packing = Packing()
    for size in [100] + [30] * 20:
        packing.add([7] * size, [0] * size, list(range(size)))
    rows_at = lambda width: len(packing._placed(width)[0])      # noqa: E731
    # At the widest group's 100: the 100 alone, then three 30s a row: 8 rows, padded to 8 x 112 = 896.
    # At 128: four 30s a row, 6 rows: 768. At 192 also 768 (100 + three 30s, then six a row: 4 x 192).
    assert plan.tokens(rows_at(100), 100) == 896 and plan.tokens(rows_at(128), 128) == 768
    assert plan.tokens(rows_at(192), 192) == 768 and plan.tokens(rows_at(224), 224) == 896
    assert plan.packing_width(100, rows_at) == 128                  # the narrowest of the fewest
    grid, placed, _ = packing.grid(0, plan.packing_width)
    assert len(grid.rows) == 6 and grid.width <= 128
    # Every group has a span of its own in its row: no two overlap, none runs past its row's tokens.
    spans = sorted((r, at, at + len(g.ids)) for (r, at), g in zip(placed, packing.groups))
    assert all(end <= len(grid.rows[r][0]) for r, _, end in spans)
    assert all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(spans, spans[1:]))
    assert sum(len(ids) for ids, _, _ in grid.rows) == 100 + 20 * 30
    uniform = Packing()
    for _ in range(20):
        uniform.add([7] * 60, [0] * 60, list(range(60)))
    # Twenty of 60: at 64, 20 rows (24 x 64 = 1536); at 128, two a row, 10 rows (12 x 128 = 1536): a tie.
    assert plan.packing_width(60, lambda w: len(uniform._placed(w)[0])) == 60


def test_a_planned_packed_pass_takes_fewer_padded_tokens(loaded_model):
    from jevany_daemon import workloads
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine
    from jevany_daemon.engine.warmup import warm_up

    model = loaded_model("qwen3", "choice")
    settings = dict(max_batch_size=6, max_packed_tokens=1536, batch_policy="greedy", max_padding_waste=1.0)
    plain, planned = Engine(model, EngineConfig(**settings)), Engine(model, EngineConfig(**settings, shape_plan=True))
    for engine in (plain, planned):
        warm_up(engine)
    planned.warm_plan()
    bodies = workloads.short(6, seed=3)
    for engine in (plain, planned):
        engine.score(engine.admit_many(bodies))
    assert plain.stats.batches == planned.stats.batches == 1
    # As they come: one group a row, each padded to the widest; planned: several to a wider row.
    assert planned.stats.padded_tokens < plain.stats.padded_tokens
