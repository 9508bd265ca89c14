"""The prefix cache: LRU within entry and byte bounds, longest-prefix reuse, a pinned head,
and answers equal to computing every prefix, on attention-only and hybrid models alike."""
from types import SimpleNamespace

import pytest
import torch

from jevany_client.schema import DecisionRequest, Media, parse_decision
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Admitted, Engine
from jevany_daemon.engine.prefix_cache import PrefixCache, cache_nbytes
from jevany_daemon.parity import compare

TOLERANCE = 1e-5


def fake_cache(nbytes: int):
    return SimpleNamespace(layers=[SimpleNamespace(keys=torch.zeros(nbytes, dtype=torch.uint8),
                                                   conv_states={0: None}, is_initialized=True)])


# --- the cache itself ----------------------------------------------------------

def test_hits_misses_and_least_recent_first_out():
    memory = PrefixCache(max_entries=2, max_bytes=1 << 20, min_tokens=2)
    a, b, c = (1, 2), (3, 4), (5, 6)
    assert memory.get(a) is None and memory.misses == 1
    memory.put(a, fake_cache(10))
    memory.put(b, fake_cache(10))
    assert memory.get(a) is not None and memory.hits == 1      # a is now the most recent
    memory.put(c, fake_cache(10))                                # evicts b, the least recent
    assert memory.keys() == [a, c] and memory.evictions == 1
    assert memory.get(b) is None
    assert memory.get((9,)) is None and memory.misses == 2       # too short to be cached: not even a miss
    assert memory.put((9,), fake_cache(1)) is False


def test_the_longest_held_prefix_serves_and_counts_what_it_saved():
    memory = PrefixCache(max_entries=4, max_bytes=1 << 20, min_tokens=3)
    memory.put((1, 2, 3), fake_cache(8))
    memory.put((1, 2, 3, 4, 5), fake_cache(8))
    memory.put((1, 9, 9), fake_cache(8))
    assert memory.peek((1, 2, 3, 4, 5, 6)) == 5 and memory.hits == memory.misses == 0   # peek counts nothing
    n, cache = memory.longest((1, 2, 3, 4, 5, 6))
    assert n == 5 and cache is not None and memory.misses == 1 and memory.reused_tokens == 5
    assert memory.keys()[-1] == (1, 2, 3, 4, 5)                  # the entry used is the most recent
    assert memory.longest((1, 2, 3))[0] == 3 and memory.hits == 1
    assert memory.longest((2, 2, 3, 4)) == (0, None) and memory.misses == 2
    assert memory.longest((1, 2, 4, 4))[0] == 0                  # an entry must be a whole prefix


def test_a_pinned_head_is_never_evicted_cleared_or_counted():
    memory = PrefixCache(max_entries=2, max_bytes=100, min_tokens=3)
    memory.pin((7,), fake_cache(20))
    for i in range(5):
        memory.put((7, i, i), fake_cache(30))
        assert memory.bytes <= 100 and (7,) in memory.pinned()
    assert len(memory) == 2 and memory.keys() == [(7, 3, 3), (7, 4, 4)]
    assert memory.longest((7, 8, 8, 8)) == (1, memory.entry((7,)).cache)
    assert memory.clear() == 2 and memory.pinned() == [(7,)] and memory.bytes == 20
    memory.reset()
    assert memory.pinned() == [(7,)] and memory.stats()["pinned_tokens"] == 1
    assert not PrefixCache(2, 10, 1).pin((1,), fake_cache(20))   # the byte bound holds for a head too


def test_a_state_that_was_extended_goes_first_out():
    memory = PrefixCache(max_entries=3, max_bytes=1 << 20, min_tokens=2)
    memory.put((1, 1), fake_cache(4))
    memory.put((2, 2), fake_cache(4))
    memory.put((2, 2, 5), fake_cache(4), extends=(2, 2))          # an agent's next turn
    assert memory.keys() == [(2, 2), (1, 1), (2, 2, 5)]
    memory.put((3, 3), fake_cache(4))
    assert memory.keys() == [(1, 1), (2, 2, 5), (3, 3)]           # the superseded turn went, not (1, 1)


def test_the_byte_bound_holds_under_a_flood_of_distinct_states():
    memory = PrefixCache(max_entries=1000, max_bytes=1000, min_tokens=1)
    for i in range(500):
        memory.put((i, i), fake_cache(64))
        assert memory.bytes <= 1000
    assert len(memory) == 1000 // 64 and memory.evictions == 500 - 1000 // 64
    assert memory.keys()[-1] == (499, 499)
    assert memory.put((7, 7, 7), fake_cache(2000)) is False      # bigger than the whole bound
    assert memory.bytes == cache_nbytes(fake_cache(64)) * len(memory)


def test_drop_and_clear():
    memory = PrefixCache(max_entries=4, max_bytes=1 << 20, min_tokens=1)
    for i in range(3):
        memory.put((i,), fake_cache(8))
    memory.drop((1,))
    assert memory.keys() == [(0,), (2,)] and memory.bytes == 16
    assert memory.clear() == 2 and len(memory) == 0 and memory.bytes == 0


# --- in the engine ---------------------------------------------------------------

REQUESTS = workloads.mixed(16, seed=5, max_words=30)
SAME_STATE = [{**REQUESTS[0], "questions": {"q": q}} for q in REQUESTS[0]["questions"].values()] * 2
AGENT = workloads.agent(3, 4, seed=4, start=(30, 60), step=(10, 30))    # 3 sessions, 4 turns each


def _cached(model, **settings):
    return Engine(model, EngineConfig(**{
        "max_batch_size": 16, "max_padding_waste": 1.0, "batch_policy": "greedy", "max_packed_tokens": 1 << 16,
        "prefix_cache": 64, "prefix_min_tokens": 1, **settings}))


def _engines(loaded_model, arch, readout, layout="rows"):
    model = loaded_model(arch, readout)
    return Engine(model, EngineConfig(layout=layout, prefix_cache=0)), _cached(model)


def _alone(engine, bodies):
    return [engine.score([engine.admit(b)])[0] for b in bodies]


def _assert_same(expected, got):
    report = compare(expected, got)
    assert report["max_abs_diff"] <= TOLERANCE, report
    assert report["decisions_changed"] == []


def _count_tokens(engine):
    """Wrap the engine's decoder: every pass's (rows, input tokens, continues a cache) is recorded."""
    real, passes = engine.passes.backbone, []

    def counting(**inputs):
        passes.append((inputs["input_ids"].shape[0], inputs["input_ids"].numel(), inputs.get("cache") is not None))
        return real(**inputs)

    engine.passes.backbone = counting
    return passes


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("readout", ["choice", "pointer", "lm_token"])
def test_cached_prefixes_give_the_answers_computing_them_gives(loaded_model, arch, readout):
    reference, cached = _engines(loaded_model, arch, readout)
    expected = _alone(reference, REQUESTS)
    first = cached.score([cached.admit(b) for b in REQUESTS[:10]])                  # all misses
    mixed = cached.score([cached.admit(b) for b in REQUESTS[5:] + REQUESTS[:5]])    # hits batched with misses
    assert cached.prefix_cache.hits >= 10 and cached.prefix_cache.misses >= 16
    assert any(r["batch"]["size"] > 1 for r in mixed)
    _assert_same(expected[:10], first)
    _assert_same(expected[5:] + expected[:5], mixed)


@pytest.mark.parametrize("layout", ["rows", "packed", "shared", "auto"])
def test_every_configured_layout_gives_the_same_answers_with_the_cache(loaded_model, layout):
    reference, _ = _engines(loaded_model, "qwen3", "choice", layout)
    cached = Engine(reference.model, EngineConfig(layout=layout, max_batch_size=16, prefix_cache=8,
                                                  prefix_min_tokens=1, batch_policy="greedy"))
    _assert_same(_alone(reference, REQUESTS), cached.score([cached.admit(b) for b in REQUESTS]))


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_an_agents_next_turn_computes_only_what_is_new(loaded_model, arch):
    reference, cached = _engines(loaded_model, arch, "choice")
    passes = _count_tokens(cached)
    got, previous = [], None
    for turn in range(4):
        batch = AGENT[turn * 3:(turn + 1) * 3]
        stems = [cached.admit(b).encoded.stem for b in batch]
        reused, before = cached.prefix_cache.reused_tokens, len(passes)
        got += cached.score([cached.admit(b) for b in batch])
        if previous:
            # each session's stem continued exactly from its last turn's
            assert all(s[:len(p)] == p for s, p in zip(stems, previous))
            assert cached.prefix_cache.reused_tokens - reused == sum(map(len, previous))
            cold = _cached(cached.model)
            cold_passes = _count_tokens(cold)
            cold.score([cold.admit(b) for b in batch])    # the same turns with only the head kept
            saved = sum(len(p) - len(cached.encoder.head) for p in previous)
            assert (sum(n for _, n, _ in passes[before:]) <= sum(n for _, n, _ in cold_passes) - saved / 2)
        previous = stems
    assert cached.prefix_cache.hits == 0 and cached.prefix_cache.misses == len(AGENT)   # every turn is a new state
    _assert_same(_alone(reference, AGENT), got)


def test_hybrid_turns_of_one_new_length_continue_together(loaded_model):
    _, cached = _engines(loaded_model, "qwen3_5", "pointer")
    state = " ".join(["refund", "parcel"] * 30)
    first = [{"state": state + f" {w}", "questions": {"q": {"type": "noul"}}} for w in ("late", "lost")]
    cached.score([cached.admit(b) for b in first])
    passes = _count_tokens(cached)
    grown = [{**b, "state": b["state"] + " and then more words came"} for b in first]
    cached.score([cached.admit(b) for b in grown])
    # one pass continues both states (same new length, no padding after a state), one runs the branches
    assert [(rows, continued) for rows, _, continued in passes] == [(2, True), (2, True)]


def test_the_prompts_head_is_computed_once_per_engine(loaded_model):
    _, cached = _engines(loaded_model, "qwen3", "choice")
    passes = _count_tokens(cached)
    head = cached.encoder.head
    assert len(head) > 40
    for chunk in (REQUESTS[:4], REQUESTS[4:8], REQUESTS[8:]):
        cached.score([cached.admit(b) for b in chunk])
    assert [p for p in passes if p == (1, len(head), False)] == [(1, len(head), False)]
    assert cached.prefix_cache.pinned() == [head] and cached.prefix_cache_stats()["pinned_tokens"] == len(head)
    held = len(cached.prefix_cache)
    assert held == len(REQUESTS) and cached.clear_prefix_cache() == held
    assert len(cached.prefix_cache) == 0 and cached.prefix_cache.pinned() == [head]


def test_identical_states_in_one_batch_are_computed_once(loaded_model):
    for arch in ("qwen3_5", "qwen3"):
        _, cached = _engines(loaded_model, arch, "pointer")
        passes = _count_tokens(cached)
        results = cached.score([cached.admit(b) for b in SAME_STATE])
        assert len({r["batch"]["size"] for r in results}) == 1
        assert passes[0][0] == 1                      # one row for the state, whoever asks about it
        assert len(cached.prefix_cache) == 1


def test_a_failed_pass_drops_the_prefixes_it_used(loaded_model):
    for arch in ("qwen3", "qwen3_5"):
        _, cached = _engines(loaded_model, arch, "choice")
        cached.score([cached.admit(b) for b in REQUESTS[:4]])
        assert len(cached.prefix_cache) == 4 and cached.prefix_cache.pinned()
        real = cached.passes.backbone

        def fails(**inputs):
            raise RuntimeError("the pass broke")

        cached.passes.backbone = fails
        outcomes = cached.score([cached.admit(b) for b in REQUESTS[:2]])
        assert all(not isinstance(o, dict) for o in outcomes)
        stems = {cached.admit(b).encoded.stem for b in REQUESTS[:2]}
        assert not stems & set(cached.prefix_cache.keys()) and len(cached.prefix_cache) == 2
        assert cached.prefix_cache.pinned() == []           # the head they continued may be what broke
        cached.passes.backbone = real
        assert all(isinstance(o, dict) for o in cached.score([cached.admit(b) for b in REQUESTS[:2]]))
        assert cached.prefix_cache.pinned()                 # computed again on the next pass


def test_cached_rows_leave_no_query_without_a_key(loaded_model):
    """Rows put back together are left-padded again; under CUDA's attention that must stay finite."""
    from .cuda_like import cuda_like_sdpa

    for arch in ("qwen3_5", "qwen3"):
        _, cached = _engines(loaded_model, arch, "choice")
        cached.score([cached.admit(b) for b in REQUESTS[:6]])
        with cuda_like_sdpa() as seen:
            results = cached.score([cached.admit(b) for b in REQUESTS])
        assert seen.calls > 0 and seen.dead_rows == 0
        assert all(isinstance(r, dict) for r in results)
        assert cached.stats.non_finite == 0


def test_short_states_reuse_the_head_but_only_states_worth_it_are_kept(loaded_model):
    engine = _cached(loaded_model("qwen3", "choice"), prefix_cache=4, prefix_min_tokens=150)
    short = workloads.short(4, seed=1)
    long = [{**body, "state": " ".join(["payment", "late"] * 40)} for body in workloads.short(3, seed=2)]
    results = engine.score([engine.admit(b) for b in short + long])
    assert engine.prefix_cache_stats()["size"] == 1             # the three long ones share one state
    assert engine.prefix_cache_stats()["reused_tokens"] >= len(engine.encoder.head) * 5
    again = engine.score([engine.admit(b) for b in long])
    assert engine.prefix_cache_stats()["hits"] == 1             # one lookup per distinct state and pass
    _assert_same(results[4:], again)


def test_requests_with_media_never_take_the_cached_path(loaded_model):
    engine = _cached(loaded_model("qwen3", "choice"))
    plain = engine.admit(REQUESTS[0])
    request = parse_decision(REQUESTS[0])
    with_media = Admitted(DecisionRequest(request.state, request.questions, media=(Media("image", "x.png"),)),
                          plain.encoded)
    assert engine.pending(plain).group == "reuse"
    assert engine.pending(with_media).group == engine.layout.name and engine.pending(with_media).alone


def test_the_byte_bound_holds_in_the_engine_under_a_flood_of_states(loaded_model):
    engine = _cached(loaded_model("qwen3", "choice"), prefix_cache=1000)
    one = engine.score([engine.admit(REQUESTS[0])])[0]
    per_entry = engine.prefix_cache.bytes - sum(cache_nbytes(engine.prefix_cache.entry(k).cache)
                                          for k in engine.prefix_cache.pinned())
    bound = engine.prefix_cache.bytes + 2 * per_entry
    engine.prefix_cache.max_bytes = bound
    for batch in range(3):
        engine.score([engine.admit(b) for b in workloads.mixed(12, seed=100 + batch, max_words=30)])
        assert engine.prefix_cache.bytes <= bound
    assert engine.prefix_cache.evictions > 0 and engine.prefix_cache.pinned()
    assert one["answers"]


def test_bf16_answers_with_the_cache_stay_within_bf16_noise(tiny_model):
    from jevany_daemon.model.loading import load_model

    bodies = REQUESTS[:8]     # a CPU without native bf16 matmuls takes 4-5x as long over them as in fp32
    for arch in ("qwen3", "qwen3_5"):
        model = load_model(str(tiny_model(arch, "choice")), device="cpu", dtype="bf16")
        off = Engine(model, EngineConfig(prefix_cache=0))
        cached = _cached(model)
        expected = _alone(off, bodies)
        got = cached.score([cached.admit(b) for b in bodies])
        got += cached.score([cached.admit(b) for b in bodies])       # hits
        report = compare(expected * 2, got)
        assert report["max_abs_diff"] < 0.05, report                # what batching alone differs by in bf16
        for i, qid in report["decisions_changed"]:                  # only where two options nearly tie
            probs = sorted(expected[i % len(expected)]["answers"][qid]["probabilities"].values())
            assert probs[-1] - probs[-2] < 2 * report["max_abs_diff"], (i, qid, probs)


def test_a_tenants_entries_are_its_own_the_head_is_everyones():
    cache = PrefixCache(max_entries=8, max_bytes=1 << 20, min_tokens=1)
    cache.pin((1, 2), fake_cache(10))
    assert cache.put((1, 2, 3, 4), fake_cache(10), tenant="alice")
    assert cache.peek((1, 2, 3, 4, 5), "alice") == 4
    assert cache.peek((1, 2, 3, 4, 5), "bob") == 2 and cache.peek((1, 2, 3, 4, 5)) == 2   # the head alone
    assert cache.get((1, 2, 3, 4), "bob") is None and cache.get((1, 2, 3, 4), "alice") is not None
    assert cache.put((1, 2, 9), fake_cache(10))                       # no tenant's (in-process): not shared
    assert cache.peek((1, 2, 9), "alice") == 2 and cache.peek((1, 2, 9)) == 3
    assert not cache.put((1, 2), fake_cache(10), tenant="alice")      # a tenant never takes the head
    assert cache.peek((1, 2, 5), "bob") == 2 and cache.pinned() == [(1, 2)]


def test_the_same_state_from_another_tenant_leaves_the_first_ones_entry_in_place():
    # Replacing alice's entry would slow her next lookup of it, and her timing would show
    # that someone else sent exactly that state.
    cache = PrefixCache(max_entries=8, max_bytes=1 << 20, min_tokens=1)
    guesses = [(5, 1, 1, 1, 1), (5, 2, 2, 2, 2), (5, 3, 3, 3, 3)]
    for guess in guesses:
        assert cache.put(guess, fake_cache(10), tenant="alice")
    held = [cache.entry(guess, "alice") for guess in guesses]
    assert cache.put(guesses[1], fake_cache(10), tenant="bob")           # the secret
    assert [cache.entry(guess, "alice") for guess in guesses] == held and all(
        a is b for a, b in zip(held, [cache.entry(guess, "alice") for guess in guesses]))
    assert all(cache.peek(guess, "alice") == 5 for guess in guesses)
    assert cache.entry(guesses[1], "bob") is not held[1] and cache.keys("bob") == [guesses[1]]
    cache.drop(guesses[1], "bob")                                        # a failed pass of bob's
    assert cache.peek(guesses[1], "alice") == 5 and cache.peek(guesses[1], "bob") == 0


def test_a_tenant_that_floods_the_cache_evicts_its_own_entries_not_anothers():
    cache = PrefixCache(max_entries=8, max_bytes=1 << 20, min_tokens=1)
    cache.pin((0,), fake_cache(10))
    alice = [(0, 1, i) for i in range(3)]
    for state in alice:
        cache.put(state, fake_cache(10), tenant="alice")
    for i in range(100):                                                 # least recent first would take alice's
        cache.put((0, 2, i), fake_cache(10), tenant="mallory")
        assert len(cache) <= 8
    assert cache.keys("alice") == alice and len(cache.keys("mallory")) == 5
    assert cache.keys("mallory") == [(0, 2, i) for i in range(95, 100)] and cache.pinned() == [(0,)]
    each = cache_nbytes(fake_cache(10))
    assert cache.tenants() == {"alice": (3, 3 * each), "mallory": (5, 5 * each)}


def test_under_the_byte_bound_each_of_n_tenants_keeps_its_share():
    each = cache_nbytes(fake_cache(100))
    cache = PrefixCache(max_entries=1000, max_bytes=12 * each, min_tokens=1)
    for i in range(4):
        cache.put((1, i), fake_cache(100), tenant="alice")
        cache.put((2, i), fake_cache(100), tenant="bob")
    for i in range(50):                                                  # a third tenant arrives, and floods
        cache.put((3, i), fake_cache(100), tenant="mallory")
        assert cache.bytes <= 12 * each
    assert {t: n for t, (n, _) in cache.tenants().items()} == {"alice": 4, "bob": 4, "mallory": 4}
    for i in range(50):                                                  # alice's new states: she gives up
        cache.put((1, 10 + i), fake_cache(100), tenant="alice")          # her own oldest, not bob's
    assert cache.keys("bob") == [(2, i) for i in range(4)]
    assert {t: n for t, (n, _) in cache.tenants().items()} == {"alice": 4, "bob": 4, "mallory": 4}


def test_past_the_byte_bound_the_tenant_holding_most_bytes_gives_one_up_though_another_holds_more_entries():
    # Past the byte bound bytes are what must be given back, so the largest holder by bytes evicts (by entries
    # only past the entry bound): a tenant of a few large states must not push out another's many small ones.
    big, small = cache_nbytes(fake_cache(400)), cache_nbytes(fake_cache(50))
    cache = PrefixCache(max_entries=100, max_bytes=2 * big + 5 * small, min_tokens=1)
    for i in range(2):
        cache.put((1, i), fake_cache(400), tenant="bulky")
    for i in range(6):                                                   # the sixth passes the byte bound
        cache.put((2, i), fake_cache(50), tenant="chatty")
    assert cache.keys("bulky") == [(1, 1)] and cache.keys("chatty") == [(2, i) for i in range(6)]
    assert cache.tenants() == {"bulky": (1, big), "chatty": (6, 6 * small)} and cache.evictions == 1


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_requests_of_different_tenants_never_share_a_cached_state(loaded_model, arch):
    # Whether a state is cached shows in how fast it is answered; a tenant must learn nothing of another's.
    reference, cached = _engines(loaded_model, arch, "choice")
    body = REQUESTS[0]
    expected = _alone(reference, [body])
    cached.score([cached.admit(body, tenant="alice")])
    hits = cached.prefix_cache.hits
    passes = _count_tokens(cached)
    got = cached.score([cached.admit(body, tenant="bob")])
    assert cached.prefix_cache.hits == hits                              # bob's lookup did not see alice's entry
    assert sum(n for _, n, _ in passes) > len(cached.admit(body).encoded.stem) - len(cached.encoder.head)
    _assert_same(expected, got)
    again = cached.score([cached.admit(body, tenant="bob")])       # bob's own entry serves bob
    assert cached.prefix_cache.hits == hits + 1
    _assert_same(expected, again)
