import pytest

from jevany_client.errors import InvalidRequestError
from jevany_client.protocol import MAX_DEPTH
from jevany_client.render import native_options, render
from jevany_client.schema import Question, parse_decision


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, ""),
        (True, "True"),
        (False, "False"),
        (1.0, "1.0"),
        (1e100, "1e+100"),
        (0.1, "0.1"),
        (-3, "-3"),
        ("plain text", "plain text"),
        ("", ""),
        ([], ""),
        ({}, ""),
    ],
)
def test_scalars_and_empties(value, text):
    assert render(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (["a", 2, None], "- a\n- 2\n- "),
        ({"a": 1, "b": "x", "c": True}, "a: 1\nb: x\nc: True"),
        ({"a": {"b": 1, "c": 2}}, "a:\n  b: 1\n  c: 2"),
        ({"a": [1, 2]}, "a:\n  - 1\n  - 2"),
        ([[1, 2], 3], "- - 1\n  - 2\n- 3"),
        ([{"a": 1, "b": 2}], "- a: 1\n  b: 2"),
        # The item's own lines keep the item's indent: only its first line is stripped.
        ({"a": [{"b": [1.5]}]}, "a:\n  - b:\n      - 1.5"),
        ({"a": None}, "a: "),
        ({"a": [], "b": 1}, "a:\n\nb: 1"),
        ({"a": {}}, "a:\n"),
        (("t", ("u",)), "- t\n- - u"),
    ],
)
def test_containers(value, text):
    assert render(value) == text


def test_indent_pads_two_spaces_per_level():
    assert render({"a": 1}, 1) == "  a: 1"
    assert render([1, [2]], 2) == "    - 1\n    - - 2"
    assert render("text", 3) == "text"


def test_deepest_valid_value_renders():
    value = "leaf"
    for _ in range(MAX_DEPTH):
        value = [value]
    assert render(value).endswith("- leaf")


def test_unvalidated_deep_value_is_refused_not_recursed():
    value = 1
    for _ in range(10_000):
        value = [value]
    with pytest.raises(InvalidRequestError):
        render(value)


def choice(criteria):
    return Question("q", "choice", None, criteria)


def test_choice_options_follow_criteria_order_and_skip_blank_descriptions():
    criteria = {"b": None, "a": "", "c": "third", "d": {"x": 1, "y": [2]}, "e": 0, "f": False}
    assert native_options(choice(criteria)) == [
        "b",
        "a",
        "c: third",
        "d: x: 1\ny:\n  - 2",
        "e: 0",
        "f: False",
    ]


@pytest.mark.parametrize(
    ("criteria", "options"),
    [
        (None, ["no", "yes"]),
        ({}, ["no", "yes"]),
        ({"true": "it is urgent"}, ["no", "yes: it is urgent"]),
        ({"false": "calm", "true": ""}, ["no: calm", "yes"]),
        ({"true": "t", "false": "f"}, ["no: f", "yes: t"]),
    ],
)
def test_noul_options_are_no_then_yes(criteria, options):
    assert native_options(Question("q", "noul", None, criteria)) == options


def test_score_options_render_each_level():
    levels = ["low", 2, 2.5, None, {"label": "high", "min": 10}]
    assert native_options(Question("q", "score", None, levels)) == [
        "low",
        "2",
        "2.5",
        "",
        "label: high\nmin: 10",
    ]


def test_parsed_request_renders():
    request = parse_decision(
        {"state": {"user": "ana", "cart": [{"sku": 1}]}, "questions": {"q": {"type": "noul"}}}
    )
    assert render(request.state) == "user: ana\ncart:\n  - sku: 1"
