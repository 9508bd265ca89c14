import copy
import math
import re

import msgpack

import pytest

from jevany_client.errors import InvalidRequestError
from jevany_client.protocol import MAX_DEPTH
from jevany_client.schema import (
    MAX_CRITERIA,
    MAX_MEDIA,
    MAX_QUESTIONS,
    DecisionRequest,
    Media,
    Question,
    check_value,
    parse_decision,
)

VALID = {
    "model": "jevany-latest",
    "state": {"ticket": "refund please", "amount": 12.5, "tags": ["a", "b"]},
    "questions": {
        "route": {
            "type": "choice",
            "instructions": "Where should it go?",
            "criteria": {"billing": "money", "tech": None, "other": {"note": [1, 2]}},
        },
        "urgent": {"type": "noul", "criteria": {"true": "needs action today"}},
        "mood": {"type": "score", "criteria": ["angry", "neutral", "happy"]},
    },
    "media": [{"type": "image", "uri": "shots/1.png"}],
}


def body(**changes):
    out = copy.deepcopy(VALID)
    for key, value in changes.items():
        if value is ...:
            del out[key]
        else:
            out[key] = value
    return out


def with_question(question, qid="q"):
    return body(questions={qid: question})


def nested(levels, leaf=1, kind=list):
    value = leaf
    for _ in range(levels):
        value = [value] if kind is list else {"k": value}
    return value


def rejects(request, match):
    with pytest.raises(InvalidRequestError, match=match):
        parse_decision(request)


def test_valid_request_parses_into_typed_records():
    request = parse_decision(VALID)
    assert isinstance(request, DecisionRequest)
    assert request.model == "jevany-latest"
    assert request.state == VALID["state"]
    assert request.media == (Media("image", "shots/1.png"),)
    route, urgent, mood = request.questions
    assert route == Question(
        "route", "choice", "Where should it go?", VALID["questions"]["route"]["criteria"]
    )
    assert route.keys == ("billing", "tech", "other")
    assert urgent.keys == ("false", "true") and urgent.n_options == 2
    assert mood.keys == ("0", "1", "2") and mood.n_options == 3
    assert urgent.instructions is None


def test_optional_fields_default():
    request = parse_decision({"state": None, "questions": {"q": {"type": "noul"}}})
    assert request.model is None
    assert request.media == ()
    assert request.state is None
    assert request.questions[0].criteria is None


def test_tuples_are_accepted_as_arrays():
    request = parse_decision(
        body(state=("a", ("b",)), questions={"s": {"type": "score", "criteria": ("lo", "hi")}})
    )
    assert request.questions[0].keys == ("0", "1")


# --- body and top-level fields ----------------------------------------------


@pytest.mark.parametrize("value", [None, [], "state", 3])
def test_body_must_be_a_map(value):
    rejects(value, "^body: must be a map")


def test_unknown_body_keys_are_named():
    rejects(body(stream=True), r"^body: unknown keys: \['stream'\]; allowed: \['media', 'model', 'questions', 'state'\]$")


def test_non_string_body_key():
    rejects({**VALID, 1: "x"}, "^body: map keys must be strings, got int")


def test_state_is_required():
    rejects(body(state=...), "^state: is required")


@pytest.mark.parametrize("model", ["", None, 5, ["m"]])
def test_model_must_be_a_non_empty_string(model):
    rejects(body(model=model), "^model: must be a non-empty string")


# --- questions --------------------------------------------------------------


def test_questions_are_required():
    rejects(body(questions=...), "^questions: is required")


@pytest.mark.parametrize("value", [[{"type": "noul"}], "q", None])
def test_questions_must_be_a_map(value):
    rejects(body(questions=value), "^questions: must be a map")


@pytest.mark.parametrize("count", [0, MAX_QUESTIONS + 1])
def test_question_count_is_bounded(count):
    questions = {f"q{i}": {"type": "noul"} for i in range(count)}
    rejects(body(questions=questions), f"must hold 1 to 64 questions, got {count}")


def test_sixty_four_questions_pass():
    questions = {f"q{i}": {"type": "noul"} for i in range(MAX_QUESTIONS)}
    assert len(parse_decision(body(questions=questions)).questions) == MAX_QUESTIONS


def test_an_empty_question_id_or_option_name_is_accepted_as_jevany_accepts_it():
    parsed = parse_decision(with_question({"type": "choice", "criteria": {"": None, "b": "blank"}}, qid=""))
    assert [(q.qid, q.keys) for q in parsed.questions] == [("", ("", "b"))]


def test_question_must_be_a_map():
    rejects(with_question("noul"), "^questions.q: must be a map")


def test_unknown_question_keys_are_named():
    rejects(with_question({"type": "noul", "label": 0}), r"^questions.q: unknown keys: \['label'\]")
    rejects(with_question({"type": "choice", "options": ["a", "b"]}),
            r"^questions.q: unknown keys: \['options'\]; allowed: \['criteria', 'instructions', 'type'\] "
            r"\(a question's options go in criteria: see docs/REQUESTS.md\)$")


def test_question_type_is_required():
    rejects(with_question({"criteria": {"a": None}}), "^questions.q.type: is required")


@pytest.mark.parametrize("qtype", ["multi", "Choice", 3])
def test_question_type_must_be_known(qtype):
    rejects(with_question({"type": qtype}), "^questions.q.type: must be one of choice, noul, score")


def test_bin_where_a_string_belongs_is_invalid_request():
    rejects(with_question({"type": b"noul"}), "^questions.q.type: bin values are not allowed")


# --- criteria ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("criteria", "match"),
    [
        (None, "is required for a choice question"),
        (["a", "b"], re.escape('must be a map of option name to description (null for none), e.g. {"a": null, "b": '
                               "null}; a list holds a score's levels")),
        ("ab", re.escape('must be a map of option name to description (null for none), e.g. {"refund": null, ')),
        ({}, "must hold 1 to 4096 options, got 0"),
        (dict.fromkeys(map(str, range(MAX_CRITERIA + 1))), "must hold 1 to 4096 options, got 4097"),
    ],
)
def test_choice_criteria_rules(criteria, match):
    request = with_question({"type": "choice", "criteria": criteria})
    rejects(request, f"^questions.q.criteria: {match}")


def test_choice_criteria_limits_pass():
    for criteria in ({"only": None}, dict.fromkeys(map(str, range(MAX_CRITERIA)))):
        request = with_question({"type": "choice", "criteria": criteria})
        question = parse_decision(request).questions[0]
        assert question.n_options == len(criteria)


def test_choice_without_criteria_key_is_rejected():
    rejects(with_question({"type": "choice"}), "^questions.q.criteria: is required")


@pytest.mark.parametrize(
    ("criteria", "match"),
    [
        (None, "is required for a score question"),
        ({"0": "low"}, "must be an array of levels"),
        (["only"], "must hold 2 to 4096 levels, got 1"),
        (list(range(MAX_CRITERIA + 1)), "must hold 2 to 4096 levels, got 4097"),
    ],
)
def test_score_criteria_rules(criteria, match):
    request = with_question({"type": "score", "criteria": criteria})
    rejects(request, f"^questions.q.criteria: {match}")


def test_score_limits_pass_with_any_json_levels():
    for levels in ([None, {"d": "high"}], list(range(MAX_CRITERIA))):
        question = parse_decision(with_question({"type": "score", "criteria": levels})).questions[0]
        assert question.criteria == levels


def test_noul_criteria_may_describe_either_side():
    for criteria in ({}, {"false": "no"}, {"true": ["yes", 1]}, {"false": None, "true": "y"}):
        request = with_question({"type": "noul", "criteria": criteria})
        question = parse_decision(request).questions[0]
        assert question.criteria == criteria


def test_noul_criteria_reject_other_keys_in_jevany_words():
    question = {"type": "noul", "criteria": {"true": "y", "maybe": 1, "abstain": 2}}
    rejects(
        with_question(question),
        r"^questions.q.criteria: noul criteria only accepts false and true; "
        r"unknown keys: \['abstain', 'maybe'\]$",
    )


def test_noul_criteria_must_be_a_map():
    rejects(with_question({"type": "noul", "criteria": ["false", "true"]}), "must be a map")


# --- media ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("media", "match"),
    [
        (None, "^media: must be an array"),
        ({"type": "image", "uri": "a"}, "^media: must be an array"),
        ([{"type": "image", "uri": "a"}] * (MAX_MEDIA + 1), "^media: must hold at most 32"),
        (["a.png"], r"^media\[0\]: must be a map"),
        ([{"type": "image", "uri": "a", "mime": "x"}], r"^media\[0\]: unknown keys: \['mime'\]"),
        ([{"type": "audio", "uri": "a"}], r"^media\[0\].type: must be one of image, video"),
        ([{"uri": "a"}], r"^media\[0\].type: must be one of"),
        ([{"type": "video", "uri": ""}], r"^media\[0\].uri: must be a non-empty string"),
        ([{"type": "video"}], r"^media\[0\].uri: must be a non-empty string"),
        ([{"type": "video", "uri": 5}], r"^media\[0\].uri: must be a non-empty string"),
    ],
)
def test_media_rules(media, match):
    rejects(body(media=media), match)


def test_thirty_two_media_items_pass():
    media = [{"type": "video", "uri": f"v{i}.mp4"} for i in range(MAX_MEDIA)]
    assert len(parse_decision(body(media=media)).media) == MAX_MEDIA


# --- values anywhere --------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    ("place", "path"),
    [
        (lambda b, x: b.update(state=["a", {"b": [x]}]), r"state\[1\].b\[0\]"),
        (lambda b, x: b["questions"]["route"].update(instructions={"w": x}), "instructions.w"),
        (lambda b, x: b["questions"]["route"]["criteria"].update(tech=x), r"route.criteria.tech"),
        (lambda b, x: b["questions"]["mood"]["criteria"].append(x), r"mood.criteria\[3\]"),
        (lambda b, x: b["questions"]["urgent"].update(criteria={"true": x}), "criteria.true"),
    ],
)
def test_non_finite_numbers_are_rejected_anywhere(place, path, bad):
    request = body()
    place(request, bad)
    rejects(request, f"{path}: numbers must be finite")


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({1: "x"}, "^state: map keys must be strings, got int"),
        ({"a": {None: 1}}, "^state.a: map keys must be strings, got nil"),
        ({"a": {b"k": 1}}, "^state.a: map keys must be strings, got bin"),
        ({("t",): 1}, "^state: map keys must be strings, got array"),
        (["ok", b"\x00"], r"^state\[1\]: bin values are not allowed"),
        (msgpack.ExtType(1, b"x"), "^state: msgpack extension types are not allowed"),
        ([msgpack.Timestamp(0)], r"^state\[0\]: msgpack extension types are not allowed"),
        ({"s": {1, 2}}, "^state.s: unsupported value of type set"),
        (2**64, "^state: integers must fit in 64 bits"),
        (-(2**63) - 1, "^state: integers must fit in 64 bits"),
    ],
)
def test_values_json_cannot_carry_are_rejected(state, match):
    rejects(body(state=state), match)


def test_sixty_four_bit_integers_pass():
    assert parse_decision(body(state=[2**64 - 1, -(2**63)])).state == [2**64 - 1, -(2**63)]


def test_depth_counts_from_the_body_map():
    # The body is level 1, so state may add 63 levels of its own.
    assert parse_decision(body(state=nested(MAX_DEPTH - 1))).state == nested(MAX_DEPTH - 1)
    rejects(body(state=nested(MAX_DEPTH)), "nests deeper than 64 levels")


def test_depth_limit_applies_inside_criteria():
    # body > questions > question > criteria map holds descriptions at level 5.
    ok = {"type": "choice", "criteria": {"a": nested(MAX_DEPTH - 4, kind=dict)}}
    assert parse_decision(with_question(ok)).questions[0].n_options == 1
    too_deep = {"type": "choice", "criteria": {"a": nested(MAX_DEPTH - 3, kind=dict)}}
    rejects(with_question(too_deep), r"^questions.q.criteria.a.k.k.*nests deeper")


@pytest.mark.parametrize("kind", [list, dict])
def test_hundred_thousand_levels_are_refused_without_recursion(kind):
    rejects(body(state=nested(100_000, kind=kind)), "nests deeper than 64 levels")


def test_long_paths_are_cut_in_messages():
    state = nested(MAX_DEPTH, kind=dict)
    state = {"x" * 500: state}
    with pytest.raises(InvalidRequestError) as info:
        parse_decision(body(state=state))
    assert len(info.value.message) < 400


def test_check_value_counts_levels_from_its_own_argument():
    check_value(nested(MAX_DEPTH), "v")
    with pytest.raises(InvalidRequestError, match="^v"):
        check_value(nested(MAX_DEPTH + 1), "v")
    with pytest.raises(InvalidRequestError):
        check_value(nested(MAX_DEPTH), "v", outer_depth=1)


def test_parse_does_not_copy_or_change_the_body():
    request = body()
    parse_decision(request)
    assert request == VALID
