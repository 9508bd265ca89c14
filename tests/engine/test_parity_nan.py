"""NaN never hides: comparisons that see it wherever it sits, and answers checked before they leave the engine.

A bad answer is reproduced on the CPU by corrupting the readout's
probabilities for one request of a batch (picked by its option count, which
no other request shares): NaN, as a CUDA kernel may give, or unnormalised,
as a readout bug would. That request alone must get `internal`; its
batch-mates get the answers they get alone; nothing non-finite comes out.
"""
import math
import threading

import pytest
import torch

from jevany_client.errors import InternalError
from jevany_daemon import workloads
from jevany_daemon.inprocess import JevModel
from jevany_daemon.parity import answer_problems, compare, non_finite, worst

TOLERANCE = 1e-5
BAD_OPTIONS = 9     # workloads ask at most 5 options: only the bad request has 9
BAD = {"state": {"ticket": "parcel lost twice"},
       "questions": {"pick": {"type": "choice", "criteria": {f"o{i}": None for i in range(BAD_OPTIONS)}}}}
MATES = workloads.mixed(6, seed=12, max_words=12)
CORRUPT = {
    "nan": lambda row: [math.nan] * len(row),
    "unnormalised": lambda row: [p / 2 for p in row],
    "out of range": lambda row: [1.5, -0.5] + row[2:],
}


def _noul(ps) -> dict:
    return {"type": "noul", "noul": round(ps[1], 2), "probabilities": dict(zip(("false", "true"), ps))}


def _result(**questions) -> dict:
    return {"answers": {qid: _noul(ps) for qid, ps in questions.items()}}


# --- comparisons ----------------------------------------------------------


@pytest.mark.parametrize("values", [[0.0, math.nan, 1e-9], [math.nan, 0.0], [1e-9, 0.0, math.nan]])
def test_worst_is_nan_wherever_the_nan_sits(values):
    assert math.isnan(worst(values)) and not worst(values) <= TOLERANCE


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_compare_fails_on_a_non_finite_reference_too(bad):
    good = [_result(a=(0.5, 0.5), b=(0.25, 0.75))]
    broken = [_result(a=(0.5, 0.5), b=(bad, 0.75))]
    for reference, other in ((broken, good), (good, broken)):
        report = compare(reference, other)
        assert not report["max_abs_diff"] <= TOLERANCE and report["non_finite"] == 1


def test_compare_fails_on_a_question_only_the_reference_has():
    report = compare([_result(a=(0.5, 0.5), z=(0.1, 0.9))], [_result(a=(0.5, 0.5))])
    assert report["mismatched"] == [(0, "z")] and not report["max_abs_diff"] <= TOLERANCE


def test_answer_problems_names_what_a_caller_could_not_trust():
    body = {"state": "s", "questions": {"a": {"type": "noul"}, "b": {"type": "noul"}}}
    assert answer_problems(body, _result(a=(0.5, 0.5), b=(0.2, 0.8))) == []
    assert any("non-finite" in p for p in answer_problems(body, _result(a=(0.5, 0.5), b=(math.nan, 0.8))))
    assert any("sum to" in p for p in answer_problems(body, _result(a=(0.5, 0.5), b=(0.2, 0.2))))
    assert any("request asked" in p for p in answer_problems(body, _result(a=(0.5, 0.5))))
    assert non_finite({"x": [1.0, {"y": math.inf}], "z": 2}) == [".x[1].y"]


# --- the engine's self-check ----------------------------------------------


def _engine(make_engine):
    # the whole hand-over fits one pass, so the bad request really has batch-mates
    return make_engine("qwen3", "pointer", layout="packed", max_batch_size=8, max_padding_waste=1.0,
                       batch_policy="greedy", max_packed_tokens=1 << 16, prefix_cache=0)


def _corrupt(engine, fault):
    """Corrupt the probabilities of every question with BAD_OPTIONS options, in every pass."""
    real = engine.readout.probabilities

    def probabilities(hidden, plan):
        # the readout's flat [sum(counts)] device tensor, question by question
        rows = real(hidden, plan).tolist()
        out, at = [], 0
        for k in plan.counts:
            out += fault(rows[at: at + k]) if k == BAD_OPTIONS else rows[at: at + k]
            at += k
        return torch.tensor(out, dtype=torch.float32)

    engine.readout.probabilities = probabilities


def _alone(engine) -> list[dict]:
    return [engine.score([engine.admit(b)])[0] for b in MATES]


@pytest.mark.parametrize("fault", sorted(CORRUPT))
def test_a_bad_answer_fails_its_request_alone(make_engine, fault):
    engine = _engine(make_engine)
    expected = _alone(engine)
    _corrupt(engine, CORRUPT[fault])
    outcomes = engine.score([engine.admit(b) for b in MATES[:3] + [BAD] + MATES[3:]])
    bad, mates = outcomes[3], outcomes[:3] + outcomes[4:]
    assert isinstance(bad, InternalError), bad
    assert ("non-finite" if fault == "nan" else "self-check") in bad.message
    assert all(isinstance(r, dict) for r in mates), mates
    report = compare(expected, mates)
    assert report["max_abs_diff"] <= TOLERANCE and report["decisions_changed"] == []
    assert [p for body, r in zip(MATES, mates) for p in answer_problems(body, r)] == []
    if fault != "nan":       # a finite pass is not rescored: the mates were answered by the shared pass
        assert {r["batch"]["size"] for r in mates} == {len(MATES) + 1}
        assert engine.stats.retried == 0


def test_a_good_pass_passes_the_self_check_unchanged(make_engine):
    engine = _engine(make_engine)
    results = engine.score([engine.admit(b) for b in MATES + [BAD]])
    assert all(isinstance(r, dict) for r in results)
    assert [p for body, r in zip(MATES + [BAD], results) for p in answer_problems(body, r)] == []


def test_in_process_callers_each_get_their_own_outcome(make_engine):
    """JevModel's threads share passes: the bad caller gets InternalError, the others their answers."""
    engine = _engine(make_engine)
    expected = _alone(engine)
    _corrupt(engine, CORRUPT["unnormalised"])
    model = JevModel(engine)
    bodies = MATES + [BAD]
    outcomes, start = {}, threading.Barrier(len(bodies))

    def call(i):
        start.wait(30)
        try:
            outcomes[i] = model.decide_body(bodies[i])
        except InternalError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(outcomes) == list(range(len(bodies)))
    assert isinstance(outcomes[len(MATES)], InternalError) and "self-check" in outcomes[len(MATES)].message
    mates = [outcomes[i] for i in range(len(MATES))]
    report = compare(expected, mates)
    assert report["max_abs_diff"] <= TOLERANCE and report["decisions_changed"] == []
    assert not [p for r in mates for p in non_finite(r)]
