"""JevAny's /v1/systemone body (gateway/shapes.py) as a strict protocol-v1 decide body, in process."""
import pytest
from pydantic import ValidationError

from jevany_daemon.gateway.shapes import MAX_MEDIA, MAX_OPTIONS, SystemOneRequest


def _request(**fields) -> SystemOneRequest:
    return SystemOneRequest.model_validate({"state": "s", "questions": {"q": {"type": "noul"}}, **fields})


def test_a_request_without_media_sends_none_and_keeps_only_the_fields_the_daemon_knows():
    body = _request(extra="ignored").to_body()
    assert body == {"state": "s", "questions": {"q": {"type": "noul", "instructions": None}},
                    "model": "jevany-latest"}


def test_criteria_sent_are_kept_even_empty():
    body = _request(questions={"q": {"type": "noul", "criteria": {}}}).to_body()
    assert body["questions"]["q"] == {"type": "noul", "instructions": None, "criteria": {}}


def test_uploaded_images_come_after_jevany_s_media_entries():
    request = _request(media=[{"type": "video", "uri": "a.mp4"}], assets={"i": {"type": "image", "part": "p"}})
    assert request.to_body(["/up/1", "/up/2"])["media"] == [
        {"type": "video", "uri": "a.mp4"}, {"type": "image", "uri": "/up/1"}, {"type": "image", "uri": "/up/2"}]
    with pytest.raises(ValueError, match="multipart"):
        request.to_body()


def test_a_score_needs_two_levels_and_a_noul_only_false_and_true():
    with pytest.raises(ValidationError):
        _request(questions={"q": {"type": "score", "criteria": ["only"]}})
    with pytest.raises(ValidationError):
        _request(questions={"q": {"type": "noul", "criteria": {"maybe": None}}})
    _request(questions={"q": {"type": "score", "criteria": ["lo", "hi"]}})


def test_a_choice_of_a_single_option_passes_and_one_of_none_does_not():
    # docs/REQUESTS.md: a choice question may have a single option (TypeSafe's reference takes 1..4096).
    body = _request(questions={"q": {"type": "choice", "criteria": {"Billing": None}}}).to_body()
    assert body["questions"]["q"]["criteria"] == {"Billing": None}
    with pytest.raises(ValidationError, match="options"):
        _request(questions={"q": {"type": "choice", "criteria": {}}})


def test_a_choice_of_exactly_the_option_cap_passes_and_one_more_does_not():
    criteria = {f"o{i}": None for i in range(MAX_OPTIONS + 1)}
    body = _request(questions={"q": {"type": "choice", "criteria": dict(list(criteria.items())[:MAX_OPTIONS])}})
    assert len(body.to_body()["questions"]["q"]["criteria"]) == MAX_OPTIONS
    with pytest.raises(ValidationError, match="options"):
        _request(questions={"q": {"type": "choice", "criteria": criteria}})


def test_media_up_to_the_cap():
    entry = {"type": "image", "uri": "x.png"}
    assert len(_request(media=[entry] * MAX_MEDIA).to_body()["media"]) == MAX_MEDIA
    with pytest.raises(ValidationError):
        _request(media=[entry] * (MAX_MEDIA + 1))


def test_a_box_question_is_refused_by_name():
    request = _request(questions={"b": {"type": "box"}})
    assert request.unsupported()[:2] == ("invalid_request", ["body", "questions", "b", "type"])
    with pytest.raises(ValueError, match="box"):
        request.to_body()
