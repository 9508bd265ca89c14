"""The self-check holds a sum to 1 from both sides: an answer whose probabilities fall short fails too."""
import pytest

from jevany_client.answers import shape_answer, validate_answer
from jevany_client.errors import InternalError
from jevany_client.schema import Question

PAIR = Question("pick", "choice", None, {"a": None, "b": None})


def test_probabilities_that_sum_to_a_half_fail_the_self_check():
    answer = shape_answer(PAIR, [0.5, 0.5])
    validate_answer(PAIR, answer)
    answer["probabilities"] = {"a": 0.25, "b": 0.25}
    with pytest.raises(InternalError, match="sum to 0.5"):
        validate_answer(PAIR, answer)


def test_a_shortfall_within_the_tolerance_passes_and_one_past_it_fails():
    # K=2: the tolerance is max(1e-5, 0.01 + 1e-8), below 1 as above it
    validate_answer(PAIR, {**shape_answer(PAIR, [0.5, 0.5]), "probabilities": {"a": 0.5, "b": 0.491}})
    with pytest.raises(InternalError, match="sum to"):
        validate_answer(PAIR, {**shape_answer(PAIR, [0.5, 0.5]), "probabilities": {"a": 0.5, "b": 0.489}})
