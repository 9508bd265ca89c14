"""What the prefix cache's layouts cost, as batching sees it, and how many passes new states take."""
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine


def cached_engine(model, **settings):
    return Engine(model, EngineConfig(max_batch_size=16, batch_policy="greedy", max_padding_waste=1.0,
                                      max_packed_tokens=1 << 16, prefix_min_tokens=1, **settings))


def test_a_hit_costs_only_what_its_cached_state_leaves_to_compute(loaded_model):
    for arch in ("qwen3", "qwen3_5"):
        engine = cached_engine(loaded_model(arch, "choice"))
        body = workloads.request(__import__("random").Random(3), 40, 1, structured=False)
        cold = engine.cost(engine.admit(body))
        engine.score([engine.admit(body)])                        # keeps its state
        admitted = engine.admit(body)
        (rows, width, prefix, *_), real = engine.cost(admitted)
        tails = sum(len(engine._reuse._tails(admitted.encoded)[i]) for i in range(len(admitted.encoded.branches)))
        stem = len(admitted.encoded.stem)
        assert engine.prefix_cache.peek(admitted.encoded.stem) == stem
        assert real == tails == rows * width + prefix, (arch, rows, width, prefix, real)
        (cold_rows, cold_width, cold_prefix, *_), cold_real = cold
        assert cold_rows * cold_width + cold_prefix >= real + stem - len(engine.encoder.head)
        assert cold_real >= real + stem - len(engine.encoder.head)
        out = engine.score([admitted])[0]
        waste = engine.stats.as_dict()["padding_waste"]
        assert 0.0 <= waste <= 1.0 and out["batch"]["padded_tokens"] <= width * rows + prefix


def test_new_hybrid_states_of_different_lengths_run_from_their_first_token_in_one_pass(loaded_model):
    engine = cached_engine(loaded_model("qwen3_5", "choice"))
    engine.score(engine.admit_many(workloads.short(1, seed=9)))
    assert engine.prefix_cache.pinned()                  # each new stem could continue the pinned head...
    held, real, calls = len(engine.prefix_cache), engine.passes.backbone, []

    def counting(**inputs):
        calls.append(inputs["input_ids"].shape)
        return real(**inputs)

    engine.passes.backbone = counting
    bodies = [{"state": " ".join(["refund"] * n), "questions": {"q": {"type": "noul"}}} for n in (20, 35, 50)]
    engine.score(engine.admit_many(bodies))
    # ...but one pass per new length would cost more than the head saves: one stem pass from the
    # first token for all three, then one pass for their rows
    assert len(calls) == 2, calls
    assert calls[0][0] == 3 and calls[1][0] == 3
    assert len(engine.prefix_cache) == held + 3


def test_requests_queued_before_the_cache_changed_are_costed_again_when_a_batch_is_taken(loaded_model):
    """A request queued as a hit whose state is then evicted computes that state again: a batch taken
    on its old cost could overrun the padded-token bound, and requests on one stem would disagree."""
    from collections import deque

    engine = cached_engine(loaded_model("qwen3", "choice"))
    rng = __import__("random").Random(4)
    state = workloads.request(rng, 40, 1, structured=False)["state"]
    bodies = [{"state": state, "questions": workloads.request(rng, 1, 1)["questions"]} for _ in range(3)]
    engine.score([engine.admit(bodies[0])])                      # keeps the state
    queue = deque(engine.pending(a) for a in engine.admit_many(bodies))
    assert {p.shared for p in queue} == {0}                      # hits: nothing of the state to compute
    engine.prefix_cache.drop(queue[0].item.encoded.stem)               # evicted while they wait
    taken = engine.take(queue)
    stem = taken[0].item.encoded.stem
    assert len(taken) == 3 and {p.shared for p in taken} == {len(stem) - engine.prefix_cache.peek(stem)} != {0}
