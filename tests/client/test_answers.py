import math
import random

import pytest

from jevany_client.answers import jevany_answers, shape_answer, validate_answer
from jevany_client.errors import InternalError
from jevany_client.schema import Question

CHOICE = Question("route", "choice", None, {"a": None, "b": "x", "c": None})
NOUL = Question("urgent", "noul", None, None)
SCORE = Question("mood", "score", None, ["low", {"mid": 1}, 3])


class Scalar:
    """Stands in for a numpy or torch scalar: only float() makes it a number."""

    def __init__(self, x):
        self.x = x

    def __float__(self):
        return self.x


def test_choice_answer():
    answer = shape_answer(CHOICE, [0.2, 0.5, 0.3])
    assert answer == {
        "type": "choice",
        "choice": "b",
        "confidence": 0.25,  # (0.5 - 1/3) / (1 - 1/3)
        "probabilities": {"a": 0.2, "b": 0.5, "c": 0.3},
    }
    assert list(answer) == ["type", "choice", "confidence", "probabilities"]


def test_jevany_answers_keep_jevany_keys_in_its_order_and_leave_the_input_alone():
    ours = {"urgent": shape_answer(NOUL, [0.25, 0.75]), "route": shape_answer(CHOICE, [0.2, 0.5, 0.3]),
            "mood": shape_answer(SCORE, [0.5, 0.25, 0.25])}
    theirs = jevany_answers(ours)
    # What JevAny's api.py writes for these probabilities, key for key
    assert theirs == {
        "urgent": {"type": "noul", "noul": 0.75},
        "route": {"type": "choice", "choice": "b", "confidence": 0.25, "probabilities": {"a": 0.2, "b": 0.5, "c": 0.3}},
        "mood": {"type": "score", "score": 0.75, "legend": {"0": "low", "1": {"mid": 1}, "2": 3},
                 "probabilities": {"0": 0.5, "1": 0.25, "2": 0.25}, "confidence": 0.62},   # 1 - 0.75 / 2
    }
    assert [list(a) for a in theirs.values()] == [["type", "noul"], ["type", "choice", "confidence", "probabilities"],
                                                   ["type", "score", "legend", "probabilities", "confidence"]]
    assert list(theirs) == ["urgent", "route", "mood"]
    assert ours["urgent"]["probabilities"] == {"false": 0.25, "true": 0.75}     # ours untouched


def test_choice_takes_the_first_maximum():
    assert shape_answer(CHOICE, [0.4, 0.2, 0.4])["choice"] == "a"


def test_choice_confidence_rounds_to_two_decimals():
    # (0.7 - 1/3) / (2/3) = 0.55
    assert shape_answer(CHOICE, [0.7, 0.2, 0.1])["confidence"] == 0.55
    # (0.41 - 1/3) / (2/3) = 0.115 -> 0.11 or 0.12 as Python rounds the float
    assert shape_answer(CHOICE, [0.41, 0.3, 0.29])["confidence"] == round(
        (0.41 - 1 / 3) / (2 / 3), 2
    )


def test_single_option_choice_is_fully_confident():
    answer = shape_answer(Question("q", "choice", None, {"only": None}), [1.0])
    assert (answer["choice"], answer["confidence"]) == ("only", 1.0)


def test_noul_answer():
    answer = shape_answer(NOUL, [0.12345, 0.87655])
    assert answer == {
        "type": "noul",
        "noul": 0.88,
        "probabilities": {"false": 0.12345, "true": 0.87655},
    }


def test_score_answer():
    answer = shape_answer(SCORE, [0.2, 0.3, 0.5])
    assert answer["score"] == 1.3  # 0*0.2 + 1*0.3 + 2*0.5
    # mode 2; E|i - 2| = 0.2*2 + 0.3*1 = 0.7; 1 - 0.7/2 = 0.65
    assert answer["confidence"] == 0.65
    assert answer["legend"] == {"0": "low", "1": {"mid": 1}, "2": 3}
    assert answer["probabilities"] == {"0": 0.2, "1": 0.3, "2": 0.5}
    assert list(answer) == ["type", "score", "legend", "probabilities", "confidence"]


def test_a_null_score_level_is_the_empty_text_the_model_read():
    # The Jev API's clients refuse a null legend value (typesafe-sdk's pydantic model); JevAny wrote null.
    answer = shape_answer(Question("mood", "score", None, ["calm", None]), [0.5, 0.5])
    assert answer["legend"] == {"0": "calm", "1": ""}


def test_score_confidence_uses_the_first_mode():
    # modes 0 and 1 tie; the first (0) gives E|i - 0| = 0.4 + 2*0.2 = 0.8, 1 - 0.8/2 = 0.6
    # (mode 1 would give 1 - 0.6/2 = 0.7)
    assert shape_answer(SCORE, [0.4, 0.4, 0.2])["confidence"] == 0.6


def test_probabilities_become_plain_floats():
    answer = shape_answer(SCORE, [Scalar(0.25), 0, 1 - 0.25])
    assert all(type(p) is float for p in answer["probabilities"].values())
    assert type(answer["score"]) is float


def test_wrong_number_of_probabilities_is_internal():
    with pytest.raises(InternalError, match="3 options but 2"):
        shape_answer(CHOICE, [0.5, 0.5])


@pytest.mark.parametrize("question", [CHOICE, NOUL, SCORE], ids=["choice", "noul", "score"])
def test_shaped_answers_pass_the_self_check(question):
    rng = random.Random(7)
    for _ in range(50):
        raw = [rng.random() for _ in range(question.n_options)]
        probs = [x / sum(raw) for x in raw]
        validate_answer(question, shape_answer(question, probs))
    assert math.isclose(sum(shape_answer(question, probs)["probabilities"].values()), 1.0)


def broken(question, probs, **changes):
    answer = shape_answer(question, probs)
    for key, value in changes.items():
        if value is ...:
            del answer[key]
        else:
            answer[key] = value
    return answer


@pytest.mark.parametrize(
    ("question", "answer", "match"),
    [
        (CHOICE, "b", "must be a map"),
        (CHOICE, broken(CHOICE, [0.2, 0.5, 0.3], type="noul"), "must be a map of type"),
        (CHOICE, broken(CHOICE, [0.2, 0.5, 0.3], probabilities={"a": 0.5, "b": 0.5}), "keys"),
        (
            CHOICE,
            broken(CHOICE, [0.2, 0.5, 0.3], probabilities={"a": 0.2, "b": 0.5, "c": 0.3, "d": 0}),
            "keys",
        ),
        (NOUL, broken(NOUL, [0.5, 0.5], probabilities={"false": -0.1, "true": 1.1}), r"\[0, 1\]"),
        (NOUL, broken(NOUL, [0.5, 0.5], probabilities={"false": math.nan, "true": 0.5}), "finite"),
        (NOUL, broken(NOUL, [0.5, 0.5], probabilities={"false": True, "true": 0.5}), "number"),
        (NOUL, broken(NOUL, [0.5, 0.5], probabilities={"false": 0.5, "true": 0.52}), "sum to"),
        (NOUL, broken(NOUL, [0.5, 0.5], probabilities={"false": 0.0, "true": 0.0}), "sum to"),
        (NOUL, broken(NOUL, [0.5, 0.5], noul=1.5), "noul must be"),
        (NOUL, broken(NOUL, [0.5, 0.5], noul=...), "noul must be"),
        (CHOICE, broken(CHOICE, [0.2, 0.5, 0.3], choice="c"), "not an argmax"),
        (CHOICE, broken(CHOICE, [0.2, 0.5, 0.3], choice="z"), "unknown choice"),
        (CHOICE, broken(CHOICE, [0.2, 0.5, 0.3], confidence=-0.5), "confidence must be"),
        (SCORE, broken(SCORE, [0.2, 0.3, 0.5], score=2.5), "score must be"),
        (SCORE, broken(SCORE, [0.2, 0.3, 0.5], score=-0.1), "score must be"),
        (SCORE, broken(SCORE, [0.2, 0.3, 0.5], score="1.3"), "score must be"),
        (SCORE, broken(SCORE, [0.2, 0.3, 0.5], legend={"0": "low", "1": "mid"}), "legend"),
        (SCORE, broken(SCORE, [0.2, 0.3, 0.5], legend=...), "legend"),
    ],
)
def test_self_check_catches_each_broken_rule(question, answer, match):
    with pytest.raises(InternalError, match=match):
        validate_answer(question, answer)


def test_all_zero_probabilities_fail_even_when_the_tolerance_is_wide():
    # K=200 makes the tolerance 1.00000001, so only the positive-sum rule catches this.
    wide = Question("q", "choice", None, dict.fromkeys(map(str, range(200))))
    answer = shape_answer(wide, [1 / 200] * 200)
    validate_answer(wide, answer)
    answer["probabilities"] = dict.fromkeys(answer["probabilities"], 0.0)
    with pytest.raises(InternalError, match="sum to 0"):
        validate_answer(wide, answer)


def test_sum_tolerance_grows_with_the_option_count():
    # K=2: max(1e-5, 0.01 + 1e-8) allows a sum of 1.009 but not 1.011.
    validate_answer(NOUL, broken(NOUL, [0.5, 0.5], probabilities={"false": 0.5, "true": 0.509}))
    with pytest.raises(InternalError):
        validate_answer(
            NOUL, broken(NOUL, [0.5, 0.5], probabilities={"false": 0.5, "true": 0.511})
        )


def test_the_self_check_takes_the_ends_of_every_range():
    # Every probability on the last level: a score of exactly the top level, a probability of exactly 0.
    for question, probs in ((SCORE, [0.0, 0.0, 1.0]), (CHOICE, [0.0, 1.0, 0.0]), (NOUL, [0.0, 1.0])):
        answer = shape_answer(question, probs)
        validate_answer(question, answer)
    assert shape_answer(SCORE, [0.0, 0.0, 1.0])["score"] == 2.0
