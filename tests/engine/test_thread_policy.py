"""The threads a CPU pass runs on: one or all, per class of pass, by what the engine measured."""
import time

import pytest
import torch

from jevany_daemon import workloads
from jevany_daemon.engine.decoder import Decoder
from jevany_daemon.engine.thread_policy import EXPLORE_EVERY, ThreadPolicy, token_class


def choices(policy, tokens, n):
    return [policy.choose(tokens) for _ in range(n)]


@pytest.fixture
def two_threads():
    """torch on two threads for the test (the suite's engines get one each under xdist), as it was after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_class_runs_on_all_threads_then_on_one_until_one_is_measured():
    policy = ThreadPolicy(most=4)
    assert choices(policy, 100, 3) == [4, 4, 4]
    policy.record(100, 4, 0.01)
    assert choices(policy, 100, 2) == [1, 1]
    policy.record(100, 1, 0.02)
    assert choices(policy, 100, 2) == [4, 4]


def test_a_class_runs_on_one_thread_where_one_measured_faster_and_tries_all_now_and_then():
    policy = ThreadPolicy(most=4)
    policy.record(100, 4, 0.010)      # 10,000 tokens a second
    policy.record(100, 1, 0.005)      # 20,000
    got = choices(policy, 100, 2 * EXPLORE_EVERY)
    assert got.count(4) == 2 and got.count(1) == 2 * EXPLORE_EVERY - 2
    assert got[EXPLORE_EVERY - 1] == got[2 * EXPLORE_EVERY - 1] == 4


def test_a_class_stays_on_all_threads_where_all_measured_faster():
    policy = ThreadPolicy(most=2)
    policy.record(1000, 2, 0.01)
    policy.record(1000, 1, 0.03)
    got = choices(policy, 1000, EXPLORE_EVERY)
    assert got.count(2) == EXPLORE_EVERY - 1 and got[-1] == 1


def test_classes_are_powers_of_two_and_learn_apart():
    assert [token_class(n) for n in (1, 2, 3, 64, 65, 128, 129)] == [0, 1, 2, 6, 7, 7, 8]
    policy = ThreadPolicy(most=2)
    policy.record(100, 2, 0.010)
    policy.record(100, 1, 0.005)
    assert policy.choose(120) == 1          # the same class: 65-128
    assert policy.choose(129) == 2          # the next one has measured nothing


def test_the_newest_pass_weighs_a_fifth_so_one_slow_pass_does_not_move_a_class():
    policy = ThreadPolicy(most=2)
    policy.record(100, 2, 0.010)      # 10,000 a second
    policy.record(100, 1, 0.005)      # 20,000
    policy.record(100, 1, 0.020)      # 5,000 once: 0.8 * 20,000 + 0.2 * 5,000 = 17,000
    assert policy.rates[(token_class(100), 1)] == pytest.approx(17_000)
    assert policy.choose(100) == 1
    for _ in range(5):                 # but a host that stays slow on one thread moves it back
        policy.record(100, 1, 0.020)
    assert policy.choose(100) == 2


def test_fixed_or_one_thread_always_runs_on_the_count_it_was_given_and_leaves_torch_alone(two_threads):
    fixed = ThreadPolicy(most=2, adaptive=False)
    fixed.record(100, 2, 0.010)
    fixed.record(100, 1, 0.001)
    assert choices(fixed, 100, 2 * EXPLORE_EVERY) == [2] * (2 * EXPLORE_EVERY)
    assert fixed.as_dict()["measured_tokens_per_s"] == {} and fixed.as_dict()["passes"] == {"1": 1, "2": 1}
    with fixed.running(1):
        assert torch.get_num_threads() == 2
    assert not ThreadPolicy(most=1).adaptive
    assert ThreadPolicy().most == 2          # the process's count by default


def test_running_sets_torchs_threads_for_the_pass_and_back_after_even_when_it_fails(two_threads):
    policy = ThreadPolicy(most=2)
    with policy.running(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), policy.running(1):
        raise RuntimeError("a failed pass")
    assert torch.get_num_threads() == 2


def test_reset_forgets_what_was_measured():
    policy = ThreadPolicy(most=2)
    policy.record(100, 2, 0.010)
    policy.record(100, 1, 0.005)
    policy.reset()
    assert policy.choose(100) == 2 and policy.as_dict()["passes"] == {} and policy.rates == {}


def test_an_engine_runs_each_pass_on_the_threads_its_policy_chose(make_engine, two_threads, monkeypatch):
    engine = make_engine("qwen3", "choice")
    assert engine.threads.adaptive and engine.threads.most == 2
    seen = []
    real = Decoder.__call__

    def counted(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Decoder, "__call__", counted)
    monkeypatch.setattr(engine.threads, "choose", lambda tokens: 1)
    out = engine.score(engine.admit_many(workloads.short(1, seed=3)))
    assert isinstance(out[0], dict)
    assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    assert engine.statistics()["threads"]["passes"] == {"1": 1}


def test_an_engine_moves_a_class_to_one_thread_where_waking_the_others_costs(make_engine, two_threads,
                                                                                monkeypatch):
    """A host where every pass on two threads waits 30 ms more (as a stalled vCPU's wake-ups make it wait)."""
    engine = make_engine("qwen3", "choice")
    real = Decoder.__call__

    def woken(self, *args, **kwargs):
        if torch.get_num_threads() > 1:
            time.sleep(0.03)            # the cost of the wake-ups, not a synchronisation
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Decoder, "__call__", woken)
    body = workloads.short(1, seed=3)
    for _ in range(EXPLORE_EVERY + 8):
        engine.score(engine.admit_many(body))
    passes = engine.statistics()["threads"]["passes"]
    # The first on two threads, then one thread but for the decision that tries two again.
    assert passes == {"2": 2, "1": EXPLORE_EVERY + 6}
    tokens = engine.threads.as_dict()["measured_tokens_per_s"]
    (one,), (two,) = [[v for k, v in tokens.items() if k.startswith(f"{n}@")] for n in (1, 2)]
    assert one > two


def test_the_policy_is_fixed_under_batch_invariance_or_when_set_fixed(make_engine, tiny_model, two_threads):
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine
    from jevany_daemon.model.loading import load_model

    assert not make_engine("qwen3", "choice", thread_policy="fixed").threads.adaptive
    # A model of its own: batch invariance changes the model's kernels, and the session's model is shared.
    model = load_model(str(tiny_model("qwen3", "choice")), device="cpu", dtype="fp32")
    assert not Engine(model, EngineConfig(batch_invariant=True)).threads.adaptive
