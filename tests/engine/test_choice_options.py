"""The choice readout's serve options: temperature, longest prompt, and the blend with a native readout."""
import math

import pytest
import torch

from jevany_client.errors import ContextLengthError
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.inprocess import JevModel
from jevany_daemon.model.loading import load_model

# Choice and score questions: their answers carry unrounded probabilities.
BODIES = [
    {"state": {"ticket": "parcel late", "days": 3},
     "questions": {"kind": {"type": "choice", "criteria": {"refund": None, "resend": "send it again", "wait": None}},
                   "sev": {"type": "score", "criteria": ["low", "mid", "high"]}}},
    {"state": "short", "questions": {"pick": {"type": "choice", "criteria": {"a": None, "b": None}}}},
    {"state": ["red car", {"speed": 2}],
     "questions": {"lvl": {"type": "score", "instructions": "how fast?", "criteria": ["0", "1", "2", "3"]}}},
]


@pytest.fixture(scope="module")
def as_choice(tiny_model):
    """as_choice(native) -> a JevAny checkpoint (pointer or lm_token) loaded with readout choice."""
    cache = {}

    def load(native="pointer", arch="qwen3"):
        if (native, arch) not in cache:
            cache[native, arch] = load_model(str(tiny_model(arch, native)), readout="choice")
        return cache[native, arch]

    return load


def _distributions(engine, bodies=BODIES, together=False):
    """Every question's probabilities, in option order, request by request."""
    admitted = [engine.admit(b) for b in bodies]
    results = engine.score(admitted) if together else [engine.score([a])[0] for a in admitted]
    return [[list(answer["probabilities"].values()) for answer in r["answers"].values()] for r in results]


def _max_diff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for pa, pb in zip(ra, rb, strict=True)
               for x, y in zip(pa, pb, strict=True))


def _log_gaps(dists):
    return [math.log(p) - math.log(q[0]) for r in dists for q in r for p in q]


# -- temperature -----------------------------------------------------------------------------

def test_choice_temperature_divides_the_choice_logits(make_engine):
    plain, hot = make_engine(), make_engine(choice_temperature=2.0)
    for g1, g2 in zip(_log_gaps(_distributions(plain)), _log_gaps(_distributions(hot)), strict=True):
        assert g2 == pytest.approx(g1 / 2, abs=1e-4)
    assert plain.describe()["choice_readout"]["temperature"] == 1.0
    assert hot.describe()["choice_readout"]["temperature"] == 2.0


def test_choice_temperature_leaves_other_readouts_alone(make_engine):
    pointer = make_engine("qwen3", "pointer")
    assert _distributions(pointer) == _distributions(make_engine("qwen3", "pointer", choice_temperature=2.0))
    assert pointer.describe()["choice_readout"] is None


def test_the_model_temperature_stays_the_default(loaded_model):
    model = loaded_model("qwen3", "choice")
    assert Engine(model).readout.temperature == model.temperature


# -- longest prompt --------------------------------------------------------------------------

def test_choice_max_tokens_refuses_a_longer_prompt(make_engine):
    short = {"state": "s", "questions": {"q": {"type": "noul"}}}
    n = make_engine().admit(short).encoded.input_tokens + 1      # the one-token answer counts
    assert make_engine(choice_max_tokens=n).admit(short)
    longer = {"state": "s " * 20, "questions": {"q": {"type": "noul"}}}
    with pytest.raises(ContextLengthError, match=rf"^the choice readout's prompt needs (at least )?\d+ tokens "
                                                 rf"including the answer; limit {n}$") as caught:
        make_engine(choice_max_tokens=n).admit(longer)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(ContextLengthError, match=rf"needs {n} tokens including the answer; limit {n - 1}$"):
        make_engine(choice_max_tokens=n - 1).admit(short)


def test_a_question_with_exactly_max_options_options_is_admitted_and_one_more_is_refused(make_engine):
    # max_options is the most the readout reads, so a question of exactly that many is one it answers; only one
    # more option is refused, with the readout's words and the typed error a client can act on.
    from jevany_client.errors import InvalidRequestError

    engine = make_engine()
    cap = engine.admission.max_options

    def body(n):
        return {"state": "s", "questions": {"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(n)}}}}

    assert engine.admit(body(cap)).request.questions[0].n_options == cap
    with pytest.raises(InvalidRequestError, match=rf"^questions\.q: exact choice-token readout supports at most "
                                                  rf"{cap} options \(got {cap + 1}\)$") as caught:
        engine.admit(body(cap + 1))
    assert caught.value.code == "invalid_request"


def test_choice_max_tokens_is_capped_by_the_window_and_the_branch_limit(make_engine):
    engine = make_engine(choice_max_tokens=1 << 30)
    window = engine.model.context_window
    described = engine.describe()["choice_readout"]
    assert engine.limits.choice == window and described["effective_max_tokens"] == window
    assert described["max_tokens"] == 1 << 30            # as configured, as JevAny reports it
    with pytest.raises(ContextLengthError, match="limit 20$"):   # the tighter limit names itself
        make_engine(choice_max_tokens=1000, max_branch_tokens=20).admit(BODIES[1])


def test_choice_max_tokens_is_for_the_choice_readout_only(make_engine):
    assert make_engine("qwen3", "pointer", choice_max_tokens=2).admit(BODIES[0])


# -- the native blend ------------------------------------------------------------------------

def test_weight_zero_is_the_choice_readout_with_no_extra_pass(as_choice):
    model = as_choice("pointer")
    assert model.readout == "choice" and model.native_readout == "pointer"
    default, zero = Engine(model), Engine(model, EngineConfig(choice_native_weight=0.0))
    assert zero.blend is None and zero.admit(BODIES[0]).native is None
    assert _distributions(zero) == _distributions(default)
    a, b = (e.score([e.admit(BODIES[0])])[0]["batch"]["padded_tokens"] for e in (Engine(model), zero))
    assert a == b


@pytest.mark.parametrize("native", ["pointer", "lm_token"])
def test_weight_one_is_the_native_readout(as_choice, loaded_model, native):
    blended = Engine(as_choice(native), EngineConfig(choice_native_weight=1.0))
    served = Engine(loaded_model("qwen3", native))
    assert _max_diff(_distributions(blended), _distributions(served)) <= 1e-5


@pytest.mark.parametrize("native", ["pointer", "lm_token"])
def test_half_pools_the_two_distributions_in_log_space(as_choice, loaded_model, native):
    blended = _distributions(Engine(as_choice(native), EngineConfig(choice_native_weight=0.5)))
    choice = _distributions(Engine(as_choice(native)))
    served = _distributions(Engine(loaded_model("qwen3", native)))
    for rb, rc, rn in zip(blended, choice, served, strict=True):
        for pb, pc, pn in zip(rb, rc, rn, strict=True):
            logits = 0.5 * torch.tensor(pc, dtype=torch.float64).clamp(min=1e-12).log() + \
                0.5 * torch.tensor(pn, dtype=torch.float64).clamp(min=1e-12).log()
            expected = logits.softmax(-1).tolist()
            assert max(abs(x - y) for x, y in zip(pb, expected)) <= 1e-5
            assert pb != pc and pb != pn


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_blended_batches_equal_requests_alone(as_choice, arch):
    records = []
    engine = Engine(as_choice("pointer", arch),
                    EngineConfig(choice_native_weight=0.3, max_batch_size=8, max_padding_waste=1.0,
                                 batch_policy="greedy"), observer=records.append)
    alone = _distributions(engine)
    records.clear()
    together = _distributions(engine, together=True)
    assert [r.size for r in records] == [len(BODIES)]
    assert _max_diff(alone, together) <= 1e-5
    uncached = Engine(as_choice("pointer", arch), EngineConfig(choice_native_weight=0.3, prefix_cache=0))
    assert _max_diff(alone, _distributions(uncached)) <= 1e-5


def test_a_blended_pass_counts_both_passes(as_choice):
    model = as_choice("pointer")
    records = []
    plain = Engine(model, EngineConfig(prefix_cache=0), observer=records.append)
    blended = Engine(model, EngineConfig(choice_native_weight=0.5, prefix_cache=0), observer=records.append)
    plain.score([plain.admit(BODIES[0])])
    admitted = blended.admit(BODIES[0])
    blended.score([admitted])
    native = admitted.native.packed_length     # packed layout, one request: no padding
    assert records[1].padded_tokens == records[0].padded_tokens + native
    assert records[1].real_tokens == records[0].real_tokens + native


def test_blend_needs_a_native_readout(loaded_model, tiny_model):
    with pytest.raises(ValueError, match=r"choice_native_weight=0\.5 needs a JevAny checkpoint.*plain causal LM"):
        Engine(loaded_model("qwen3", "choice"), EngineConfig(choice_native_weight=0.5))
    with pytest.raises(ValueError, match="choice_native_weight=1.0 blends the choice readout.*pointer readout"):
        Engine(loaded_model("qwen3", "pointer"), EngineConfig(choice_native_weight=1.0))
    with pytest.raises(ValueError, match="choice_native_weight"):
        JevModel.load(str(tiny_model("qwen3", "choice")), choice_native_weight=0.5)


def test_describe_names_the_settings(as_choice):
    engine = Engine(as_choice("lm_token"), EngineConfig(choice_native_weight=0.25, choice_temperature=0.5,
                                                        choice_max_tokens=512, date_facts=True))
    d = engine.describe()
    assert d["readout"] == "choice" and d["date_facts"] is True
    assert d["choice_readout"] == {"temperature": 0.5, "native_weight": 0.25, "max_tokens": 512,
                                   "native_readout": "lm_token", "native_temperature": 1.5,
                                   # JevAny's legacy names and its capped limit, beside
                                   "pointer_weight": 0.25, "pointer_temperature": 1.5,
                                   "effective_max_tokens": 512, "backbone_context_window": 4096}
    assert d["letter_readout"] == d["choice_readout"] and d["temperature"] == 0.5
    # Both readouts must be able to answer: the tighter option cap holds.
    assert d["max_options"] == min(engine.readout.max_options, engine.blend.readout.max_options)


def test_in_process_settings_reach_the_engine(tiny_model):
    model = JevModel.load(str(tiny_model("qwen3", "pointer")), readout="choice", choice_native_weight=1.0,
                          date_facts=True, choice_max_tokens=4096)
    d = model.describe()
    assert d["choice_readout"]["native_weight"] == 1.0 and d["choice_readout"]["max_tokens"] == 4096
    assert d["date_facts"] is True
    assert model.decide("due 2026-01-02 from 2026-01-01", {"q": {"type": "noul"}})["answers"]["q"]["type"] == "noul"
