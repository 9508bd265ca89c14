import dataclasses

import pytest

from jevany_client import Choice, Noul, Score, parse_decision, questions_to_wire


def test_choice_from_names_has_no_descriptions():
    assert Choice(["billing", "tech"]).to_wire() == {
        "type": "choice",
        "criteria": {"billing": None, "tech": None},
    }


def test_choice_from_map_keeps_descriptions_order_and_instructions():
    question = Choice({"z": "last letter", "a": {"n": 1}}, instructions="Pick one")
    wire = question.to_wire()
    assert wire == {
        "type": "choice",
        "instructions": "Pick one",
        "criteria": {"z": "last letter", "a": {"n": 1}},
    }
    assert list(wire["criteria"]) == ["z", "a"]


def test_choice_refuses_repeated_names():
    with pytest.raises(ValueError, match="repeat"):
        Choice(["a", "b", "a"])


@pytest.mark.parametrize("make", [Choice, Score])
def test_a_bare_string_is_not_a_list_of_options(make):
    with pytest.raises(TypeError, match="not the str"):
        make("abc")


def test_noul_wire_forms():
    assert Noul().to_wire() == {"type": "noul"}
    assert Noul("Is it urgent?", {"true": "today"}).to_wire() == {
        "type": "noul",
        "instructions": "Is it urgent?",
        "criteria": {"true": "today"},
    }


def test_score_levels_are_an_ordered_array():
    wire = Score(iter(["low", "mid", "high"]), instructions={"scale": 3}).to_wire()
    assert wire == {
        "type": "score",
        "instructions": {"scale": 3},
        "criteria": ["low", "mid", "high"],
    }


def test_helpers_are_frozen_and_do_not_share_caller_state():
    names = {"a": None}
    question = Choice(names)
    names["b"] = None
    assert question.to_wire()["criteria"] == {"a": None}
    with pytest.raises(dataclasses.FrozenInstanceError):
        question.instructions = "x"


def test_questions_to_wire_mixes_helpers_and_maps():
    wire = questions_to_wire(
        {
            "route": Choice(["a", "b"]),
            "urgent": Noul(),
            "raw": {"type": "score", "criteria": [1, 2]},
        }
    )
    assert wire == {
        "route": {"type": "choice", "criteria": {"a": None, "b": None}},
        "urgent": {"type": "noul"},
        "raw": {"type": "score", "criteria": [1, 2]},
    }


def test_questions_to_wire_refuses_other_values():
    with pytest.raises(TypeError, match="'q'"):
        questions_to_wire({"q": "noul"})


def test_wire_questions_pass_the_schema():
    questions = questions_to_wire(
        {"route": Choice(["a", "b"], "Which?"), "urgent": Noul(), "mood": Score([0, 1, 2])}
    )
    request = parse_decision({"state": "s", "questions": questions})
    assert [q.keys for q in request.questions] == [("a", "b"), ("false", "true"), ("0", "1", "2")]
    assert request.questions[0].instructions == "Which?"


def test_a_media_path_is_told_by_its_prefix_or_its_suffix_whatever_its_case():
    from jevany_client.questions import Image, Video, media_from_path

    assert media_from_path("shots/PHOTO.JPG") == Image("shots/PHOTO.JPG")
    assert media_from_path("clip.Mp4") == Video("clip.Mp4")
    assert media_from_path("video:frames.bin") == Video("frames.bin")
    assert media_from_path("image:scan") == Image("scan")
    for unknown in ("notes.txt", "image:", "scan"):
        with pytest.raises(ValueError, match="cannot tell whether"):
            media_from_path(unknown)
