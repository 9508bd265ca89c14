"""The adaptive batch policy, on made-up pass timings."""
from jevany_daemon.engine.batch_policy import EXPLORE_EVERY, BatchPolicy, width_class


def decisions(policy, width, n):
    return [policy.allows_batching(width) for _ in range(n)]


def test_batches_until_it_has_measured_both():
    policy = BatchPolicy()
    assert all(decisions(policy, 300, 10))
    policy.record(300, 8, 2400, 1.0)          # batched: 2400 tokens/s
    got = decisions(policy, 300, 2 * EXPLORE_EVERY)
    assert got.count(False) == 2                # explores "alone" once per EXPLORE_EVERY


def test_runs_alone_where_batching_measured_slower():
    policy = BatchPolicy()
    policy.record(300, 8, 2000, 1.0)            # batched 2000 tokens/s
    policy.record(300, 1, 300, 0.1)             # alone 3000 tokens/s
    got = decisions(policy, 280, 4 * EXPLORE_EVERY)
    assert got.count(True) == 4                 # only the exploration tries batching
    # other width classes are judged separately
    assert all(decisions(policy, 40, 5))


def test_batches_where_batching_measured_faster():
    policy = BatchPolicy()
    policy.record(40, 16, 4000, 0.5)            # 8000 tokens/s
    policy.record(40, 1, 40, 0.01)              # 4000 tokens/s
    got = decisions(policy, 40, 4 * EXPLORE_EVERY)
    assert got.count(False) == 4


def test_estimates_follow_new_measurements():
    policy = BatchPolicy()
    policy.record(100, 8, 1000, 1.0)
    policy.record(100, 1, 100, 0.05)            # alone faster
    for _ in range(30):
        policy.record(100, 8, 8000, 1.0)        # batching got much faster (e.g. load changed)
    assert decisions(policy, 100, 3) == [True, True, True]


def test_greedy_always_batches():
    policy = BatchPolicy(adaptive=False)
    policy.record(300, 8, 1, 1.0)
    policy.record(300, 1, 1000, 0.1)
    assert all(decisions(policy, 300, 50))


def test_width_classes_are_powers_of_two():
    assert [width_class(w) for w in (1, 2, 3, 4, 5, 64, 65, 128)] == [0, 1, 2, 2, 3, 6, 7, 7]


def test_the_newest_pass_weighs_a_fifth_in_the_running_rate():
    policy = BatchPolicy()
    policy.record(64, 8, 100, 1.0)            # 100 tokens/s
    policy.record(64, 8, 200, 1.0)            # 200 tokens/s: 0.8 x 100 + 0.2 x 200
    assert policy.rates[(width_class(64), True)] == 120.0
    assert policy.as_dict() == {"batched@64": 120.0}


def test_on_an_accelerator_a_batch_is_never_split_to_time_one_request_alone():
    policy = BatchPolicy(explore_alone=False)
    assert all(decisions(policy, 300, 2 * EXPLORE_EVERY))     # nothing measured yet
    policy.record(300, 8, 2400, 1.0)
    assert all(decisions(policy, 300, 4 * EXPLORE_EVERY))     # batched measured, alone never tried
    policy.record(300, 1, 100, 0.1)                           # a lone pass that happened anyway: slower
    assert all(decisions(policy, 300, 4 * EXPLORE_EVERY))


def test_on_an_accelerator_batching_is_still_tried_where_alone_measured_faster():
    policy = BatchPolicy(explore_alone=False)
    policy.record(300, 8, 2000, 1.0)            # batched 2000 tokens/s
    policy.record(300, 1, 300, 0.1)             # alone 3000 tokens/s
    got = decisions(policy, 280, 4 * EXPLORE_EVERY)
    assert got.count(True) == 4                 # batching explored once per EXPLORE_EVERY, as on a CPU


def test_an_engine_on_an_accelerator_never_splits_a_batch_to_explore(loaded_model):
    from collections import deque

    from jevany_daemon import workloads
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine

    def sizes(engine):
        pendings = [engine.pending(engine.admit(b)) for b in workloads.short(8, seed=2)]
        width = pendings[0].width
        engine.policy.record(width, 8, 2400, 1.0)       # a batched pass measured at this width
        return [len(engine.take(deque(pendings))) for _ in range(2 * EXPLORE_EVERY)]

    model = loaded_model("qwen3", "choice")
    config = EngineConfig(max_batch_size=8, batch_policy="adaptive", max_padding_waste=1.0)
    assert set(sizes(Engine(model, config, simulated_pass_ms=1))) == {8}
    on_cpu = sizes(Engine(model, config))
    assert on_cpu.count(1) == 2 and on_cpu.count(8) == 2 * EXPLORE_EVERY - 2   # a CPU times one alone now and then
