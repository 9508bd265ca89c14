"""Where JevAny's HTTP API and TypeSafe's Jev API differ (gateway/dialects.py), in process: no model."""
import pytest

from jevany_daemon.gateway.dialects import OPENAI, answer_body, error_body, error_status, score_confidence

RESULT = {"model": "jev-latest", "latency_ms": 12, "usage": {"input_tokens": 3}, "batch": {"size": 2},
          "answers": {"s": {"type": "score", "score": 1, "confidence": 1.0,
                            "probabilities": {"0": 0.0, "1": 1.0, "2": 0.0},
                            "legend": {"0": 1, "1": [2], "2": {"k": 3}}}}}


def test_a_single_level_is_certain_and_confidence_never_goes_below_zero():
    assert score_confidence([1.0]) == 1.0
    assert score_confidence([0.5, 0.0, 0.5]) == 0.0      # more spread than the uniform's: clipped
    assert score_confidence([0.0, 0.0, 1.0]) == 1.0


def test_a_spread_scores_against_the_uniform_distributions_mean_distance_from_the_middle():
    # docs/JEV-API.md: 1 - sum p_i |i - mode| / S, S = sum |i - (n-1)/2| / n. Over 4 levels S = (1.5+0.5+0.5+1.5)/4
    # = 1, over 5 S = 6/5; a slip to dividing by n - 1 (4/3, 3/2) would give 0.625 and 0.733.
    assert score_confidence([0.1, 0.6, 0.2, 0.1]) == pytest.approx(1 - 0.5 / 1.0)
    assert score_confidence([0.0, 0.2, 0.6, 0.2, 0.0]) == pytest.approx(1 - 0.4 / 1.2)


def test_typesafe_names_our_latency_apart_and_jevany_keeps_its_own():
    typesafe = answer_body(RESULT, "typesafe", additions=False)
    assert typesafe["x_latency_ms"] == 12 and "latency_ms" not in typesafe and "x_batch" not in typesafe
    jevany = answer_body(RESULT, "jevany", additions=False)
    assert set(jevany) == {"model", "answers", "usage", "latency_ms"} and jevany["latency_ms"] == 12
    assert answer_body(RESULT, "jevany", additions=True) is RESULT
    assert answer_body(RESULT, "typesafe", additions=True)["x_batch"] == {"size": 2}


def test_typesafe_shows_a_number_level_as_text_and_keeps_objects_and_arrays():
    legend = answer_body(RESULT, "typesafe", additions=False)["answers"]["s"]["legend"]
    assert legend == {"0": "1", "1": [2], "2": {"k": 3}}


def test_openai_errors_are_400s_for_refused_bodies_and_keep_other_statuses():
    assert [error_status(OPENAI, code, status) for code, status in (
        ("invalid_request", 422), ("unknown_model", 422), ("overloaded", 429), ("internal", 500),
        ("unauthorized", 401), ("invalid_message", 400))] == [400, 404, 429, 500, 401, 400]
    assert error_status("typesafe", "unknown_model", 422) == 400
    assert error_status("jevany", "unknown_model", 422) == 422


@pytest.mark.parametrize("status, kind", [(500, "server_error"), (503, "server_error"), (499, "invalid_request_error"),
                                          (400, "invalid_request_error"), (429, "rate_limit_exceeded")])
def test_openai_error_types_follow_the_status(status, kind):
    assert error_body(OPENAI, status, "internal", "m")["error"]["type"] == kind


def test_openai_param_is_where_in_the_body_without_union_tags():
    loc = ["body", "questions", 0, "choice", "choices"]
    assert error_body(OPENAI, 400, "invalid_request", "m", loc)["error"] == {
        "message": "m", "type": "invalid_request_error", "param": "questions.0.choices", "code": "invalid_request"}
    assert error_body(OPENAI, 404, "unknown_model", "m")["error"]["code"] == "model_not_found"
    assert error_body(OPENAI, 400, "invalid_request", "m", ["body"])["error"]["param"] is None


def test_jevany_errors_are_detail_strings_but_a_missing_token_is_the_field_s_shape():
    assert error_body("jevany", 422, "invalid_request", "m") == {"detail": "m"}
    assert error_body("jevany", 401, "unauthorized", "m") == {
        "detail": {"error_type": "authentication_error", "message": "m"}}


def test_typesafe_errors_name_their_kind():
    assert error_body("typesafe", 413, "invalid_request", "m") == {
        "detail": {"error_type": "request_too_large", "message": "m"}}
    assert error_body("typesafe", 429, "overloaded", "m")["detail"]["error_type"] == "rate_limit_error"
    assert error_body("typesafe", 400, "no_such_code", "m")["detail"]["error_type"] == "invalid_request_error"
    assert error_body("typesafe", 422, "unknown_model", "m") == {
        "detail": [{"loc": ["body", "model"], "msg": "m", "type": "unknown_model"}]}
