"""--batch-invariant: every answer the same to the last bit alone, in passes of random companions and at
any place in them, on every readout and both architectures, FP32 and BF16 (model/invariant.py)."""
import random

import pytest

from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.engine.warmup import WarmUpError, warm_up
from jevany_daemon.model.loading import load_model
from jevany_daemon.parity import compare, exact_part

# Lengths from a few words to about 200 tokens, 1 to 4 questions: widths and option counts vary by pass.
REQUESTS = workloads.mixed(16, seed=5, max_words=60)


def invariant_engine(tiny_model, arch, readout, dtype="fp32", **settings):
    # A model of its own: the engine swaps its kernels for good, and the session's shared models stay as loaded.
    model = load_model(str(tiny_model(arch, readout)), device="cpu", dtype=dtype)
    # Room for 16 requests of up to four questions of up to about 100 tokens each, rounded
    settings = {"max_batch_size": 16, "max_padding_waste": 1.0, "batch_policy": "greedy", "max_packed_tokens": 1 << 15,
                **settings}
    return Engine(model, EngineConfig(batch_invariant=True, **settings))


def random_passes(rng: random.Random, n: int) -> list[list[int]]:
    """The requests shuffled, then cut into a pass of 8 and passes of 2 to 12."""
    order = list(range(n))
    rng.shuffle(order)
    passes, at = [], 0
    while at < n:
        size = 8 if at == 0 else rng.randint(2, 12)
        passes.append(order[at: at + size])
        at += size
    return passes


def assert_invariant(engine, requests, seed, trials=1, biggest=8):
    alone = [exact_part(engine.score([engine.admit(b)])[0]) for b in requests]
    rng, sizes = random.Random(seed), []
    for _ in range(trials):
        for members in random_passes(rng, len(requests)):
            results = engine.score([engine.admit(requests[i]) for i in members])
            sizes += [r["batch"]["size"] for r in results]
            moved = [i for i, r in zip(members, results) if exact_part(r) != alone[i]]
            assert moved == [], f"requests {moved} of a pass of {members} differ from their answers alone"
    assert max(sizes) >= biggest        # the passes really held many requests


# auto: flat on the attention-only qwen3, rows on the hybrid qwen3_5 (engine.choose_layout)
@pytest.mark.parametrize("arch,readout,dtype,layout", [
    ("qwen3", "choice", "fp32", "auto"),
    ("qwen3", "pointer", "fp32", "auto"),
    ("qwen3", "lm_token", "fp32", "auto"),
    ("qwen3", "choice", "fp32", "rows"),
    ("qwen3_5", "choice", "fp32", "auto"),
    ("qwen3_5", "pointer", "fp32", "auto"),
    ("qwen3", "choice", "bf16", "auto"),
    ("qwen3_5", "pointer", "bf16", "auto"),
])
def test_every_answer_is_the_same_to_the_last_bit_alone_and_in_any_pass(tiny_model, arch, readout, dtype, layout):
    engine = invariant_engine(tiny_model, arch, readout, dtype, layout=layout)
    assert engine.layout.name == ("flat" if (arch, layout) == ("qwen3", "auto") else "rows")
    requests = REQUESTS if dtype == "fp32" else REQUESTS[:10]      # BF16 on a CPU is slow
    assert_invariant(engine, requests, seed=f"{arch}-{readout}-{dtype}-{layout}")


@pytest.mark.parametrize("layout", ["rows", "auto"])
def test_long_rows_beside_longer_ones_keep_their_bits(tiny_model, layout):
    """Rows of hundreds of tokens beside others: where torch's own attention blocks by width."""
    long = workloads.mixed(4, seed=9, min_words=300, max_words=550, max_questions=1) + REQUESTS[:2]
    engine = invariant_engine(tiny_model, "qwen3", "choice", layout=layout)
    assert max(exact_part(engine.score([engine.admit(b)])[0])[1]["input_tokens"] for b in long) > 600
    assert_invariant(engine, long, seed="long", biggest=4)


def test_the_prefix_cache_and_layout_settings_change_no_answer(tiny_model):
    """The cache is not used: answers with it on are those with it off."""
    on = invariant_engine(tiny_model, "qwen3", "choice", prefix_cache=8, prefix_min_tokens=16)
    off = invariant_engine(tiny_model, "qwen3", "choice", prefix_cache=0)
    assert on.prefix_cache is None and on.describe()["batch_invariant"] is True
    # each state twice: with a cache, the second would be a hit
    requests = REQUESTS[:8] + REQUESTS[:8]
    assert [exact_part(r) for r in on.score([on.admit(b) for b in requests])] == \
           [exact_part(off.score([off.admit(b)])[0]) for b in requests]


@pytest.mark.parametrize("arch,readout,layout", [("qwen3_5", "pointer", "rows"), ("qwen3", "choice", "packed")])
def test_answers_stay_within_parity_of_the_default_kernels(tiny_model, loaded_model, arch, readout, layout):
    """Each batch-invariant layout against the default one it computes as: rows (hybrid), packed (flat)."""
    invariant = invariant_engine(tiny_model, arch, readout)
    default = Engine(loaded_model(arch, readout), EngineConfig(max_batch_size=16, layout=layout, prefix_cache=0))
    report = compare(default.score([default.admit(b) for b in REQUESTS]),
                     invariant.score([invariant.admit(b) for b in REQUESTS]))
    assert report["max_abs_diff"] <= 1e-5, report
    assert report["decisions_changed"] == [] and report["probabilities"] > len(REQUESTS) * 2


def test_the_warm_up_checks_the_promise_on_this_host_and_refuses_to_serve_without_it(tiny_model):
    engine = invariant_engine(tiny_model, "qwen3_5", "choice")
    assert "batch-invariant, checked" in warm_up(engine)
    engine.layout.rounded = None        # widths as they come: a hybrid layer's gates end in scalar code
    with pytest.raises(WarmUpError, match="batch_invariant: on this host"):
        warm_up(engine)


@pytest.mark.parametrize("settings,words", [
    ({"layout": "packed"}, "its own layouts"),
    ({"layout": "shared"}, "its own layouts"),
    ({"shape_plan": True}, "shape plan"),
    ({"compile": "default"}, "shape plan"),
])
def test_the_settings_refuse_what_cannot_be_invariant(settings, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(batch_invariant=True, **settings)


def test_a_flat_pass_is_priced_at_the_padding_it_holds(tiny_model):
    """Requests of different lengths share a flat pass under the CPU's default padding bound (10%): rows end to
    end pad only their own rounding, where pricing each request as wide as the widest would keep them apart."""
    engine = invariant_engine(tiny_model, "qwen3", "choice", max_padding_waste=None)
    assert engine.batch_limits.max_padding_waste == 0.1 and engine.layout.name == "flat"
    requests = workloads.mixed(8, seed=11, min_words=5, max_words=200, max_questions=2)
    shapes = [engine.layout.shape(engine.admit(b).encoded) for b in requests]
    assert max(s.width for s in shapes) > 3 * min(s.width for s in shapes)
    results = engine.score([engine.admit(b) for b in requests])
    assert [r["batch"]["size"] for r in results] == [8] * 8
    padded = sum(s.width for s in shapes)
    assert results[0]["batch"]["padded_tokens"] == padded