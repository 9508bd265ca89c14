"""OpenAI's Decisions API body as a decide request and back (gateway/decisions.py), in process: no model."""
import pytest
from pydantic import ValidationError

from jevany_daemon.gateway.decisions import DecisionsRequest, usage


def _request(*questions, input_="A parcel is late.") -> DecisionsRequest:
    return DecisionsRequest.model_validate({"model": "jev-latest", "input": input_, "questions": list(questions)})


def test_each_question_becomes_the_decide_question_a_jev_caller_would_send():
    # A boolean choice value is named as JSON writes it, each keeping its own description; a level's
    # description follows its label, a level without one is its label alone.
    body = _request(
        {"type": "predicate", "instructions": "Refund?"},
        {"type": "choice", "instructions": "Sure?", "choices": [
            {"value": True, "description": "yes"}, {"value": False, "description": "no"}]},
        {"type": "score", "instructions": "Anger?", "levels": [
            {"label": "calm"}, {"label": "cross", "description": "raised voice"}]}).to_body()
    assert body["questions"] == {
        "0": {"type": "noul", "instructions": "Refund?"},
        "1": {"type": "choice", "instructions": "Sure?", "criteria": {"true": "yes", "false": "no"}},
        "2": {"type": "score", "instructions": "Anger?", "criteria": ["calm", "cross: raised voice"]}}


def test_messages_become_one_state_their_texts_apart_by_a_blank_line():
    messages = [{"role": "user", "content": "first"},
                {"role": "user", "content": [{"type": "input_text", "text": "second"},
                                             {"type": "input_text", "text": "third"}]}]
    body = _request({"type": "predicate", "instructions": "?"}, input_=messages).to_body()
    assert body["state"] == "first\n\nsecond\n\nthird"


def test_a_choice_needs_two_distinct_values_a_boolean_and_its_json_name_being_one():
    for choices in ([{"value": "a"}], [{"value": "a"}, {"value": "a"}], [{"value": True}, {"value": "true"}],
                    [{"value": False}, {"value": "false"}]):
        with pytest.raises(ValidationError):
            _request({"type": "choice", "instructions": "?", "choices": choices})
    _request({"type": "choice", "instructions": "?", "choices": [{"value": True}, {"value": "maybe"}]})


def test_a_score_needs_two_levels():
    with pytest.raises(ValidationError):
        _request({"type": "score", "instructions": "?", "levels": [{"label": "only"}]})


def test_answers_come_back_in_question_order_with_their_values_and_expectations():
    request = _request({"type": "predicate", "name": "p", "instructions": "?"},
                       {"type": "choice", "name": "c", "instructions": "?",
                        "choices": [{"value": True}, {"value": "x"}]},
                       {"type": "score", "instructions": "?", "levels": [{"label": "lo"}, {"label": "hi"}]})
    answers = {"0": {"probabilities": {"true": 0.75, "false": 0.25}},
               "1": {"choice": "true", "probabilities": {"true": 0.9, "x": 0.1}},
               "2": {"probabilities": {"0": 0.25, "1": 0.75}}}
    shown = {"0": {}, "1": {"confidence": 0.8}, "2": {"confidence": 0.5}}
    assert request.answers(answers, shown) == [
        {"type": "predicate", "name": "p", "probability": 0.75},
        {"type": "choice", "name": "c", "choice": True, "confidence": 0.8,
         "probabilities": [{"value": True, "probability": 0.9}, {"value": "x", "probability": 0.1}]},
        {"type": "score", "name": None, "score": 0.75, "confidence": 0.5,
         "probabilities": [{"value": 0, "label": "lo", "probability": 0.25},
                           {"value": 1, "label": "hi", "probability": 0.75}]}]


def test_usage_counts_what_the_daemon_counts_and_zero_for_the_rest():
    assert usage({"usage": {"input_tokens": 30, "output_tokens": 2}}) == {
        "input_tokens": 30, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 32}


def test_only_input_image_parts_are_images():
    text = [{"role": "user", "content": [{"type": "input_text", "text": "t"}]}]
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]
    question = {"type": "predicate", "instructions": "?"}
    assert [_request(question, input_=i).images() for i in ("plain", text, image)] == [False, False, True]
