"""JevModel: the in-process API gives the engine's answers and typed errors."""
import pytest

from jevany_client import Choice, Noul, Score
from jevany_client.errors import InvalidRequestError
from jevany_daemon.inprocess import JevModel


def test_load_and_decide_with_question_helpers(tiny_model):
    model = JevModel.load(str(tiny_model("qwen3", "pointer")), max_batch_size=4)
    result = model.decide(
        {"ticket": "late parcel"},
        {"kind": Choice(["refund", "resend"]), "urgent": Noul(), "sev": Score(["low", "mid", "high"])},
    )
    assert set(result["answers"]) == {"kind", "urgent", "sev"}
    assert result["answers"]["kind"]["choice"] in ("refund", "resend")
    same = model.decide_body({"state": {"ticket": "late parcel"}, "questions": {
        "kind": {"type": "choice", "criteria": {"refund": None, "resend": None}},
        "urgent": {"type": "noul"},
        "sev": {"type": "score", "criteria": ["low", "mid", "high"]}}})
    assert same["answers"] == result["answers"]
    assert model.describe()["limits"]["max_batch_size"] == 4


def test_bad_settings_fail_before_loading(tmp_path):
    with pytest.raises(ValueError, match="max_batch_size"):
        JevModel.load(str(tmp_path / "does-not-exist"), max_batch_size=0)


def test_typed_errors(tiny_model):
    model = JevModel.load(str(tiny_model("qwen3", "choice")))
    with pytest.raises(InvalidRequestError):
        model.decide("s", {"q": {"type": "maybe"}})
