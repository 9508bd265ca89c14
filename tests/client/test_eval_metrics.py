"""jevany-eval's metrics against values worked by hand, and the bootstrap's determinism."""
import json
import math

import pytest

from jevany_client.answers import shape_answer
from jevany_client.eval import metrics
from jevany_client.eval.report import build_report, report_json
from jevany_client.eval.results import answer_record
from jevany_client.eval.suite import parse_item

CHOICE = {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}
NOUL = {"type": "noul"}
SCORE = {"type": "score", "criteria": ["low", "mid", "high"]}


def suite_items(lines: list[dict]):
    return [parse_item(json.dumps(line).encode(), i) for i, line in enumerate(lines)]


def answered(items, probabilities: list[dict]) -> dict:
    """Records as the runner writes them: each item's questions answered with the given probabilities."""
    records = {}
    for item, by_question in zip(items, probabilities):
        answers = {q.qid: shape_answer(q, by_question[q.qid]) for q in item.request.questions}
        records[item.index] = answer_record(item, {"model": "m", "answers": answers})
    return records


# Four items, one question each, worked by hand:
#   0 choice  p=(.5,.3,.2)   label a  right  NLL ln 2  = 0.693147  Brier .25+.09+.04    = 0.38   conf .5 (bin 7)
#   1 noul    p=(.2,.8)      label F  wrong  NLL ln 5  = 1.609438  Brier .64+.64        = 1.28   conf .8 (bin 12)
#   2 score   p=(.1,.7,.2)   label 1  right  NLL -ln.7 = 0.356675  Brier .01+.09+.04    = 0.14   conf .7 (bin 10)
#   3 choice  p=(.9,.05,.05) label b  wrong  NLL ln 20 = 2.995732  Brier .81+.9025+.0025 = 1.715 conf .9 (bin 13)
# Overall: accuracy 2/4 = .5; NLL 5.654992/4 = 1.413748; Brier 3.515/4 = .87875;
#   ECE: every bin holds one question, so (|1-.5| + |0-.8| + |1-.7| + |0-.9|)/4 = 2.5/4 = .625.
# Choice: accuracy .5; NLL (0.693147+2.995732)/2 = 1.844440; Brier (.38+1.715)/2 = 1.0475; ECE (.5+.9)/2 = .7.
HAND = [
    ({"state": 0, "questions": {"q": CHOICE}, "labels": {"q": "a"}}, {"q": [0.5, 0.3, 0.2]}),
    ({"state": 1, "questions": {"q": NOUL}, "labels": {"q": False}}, {"q": [0.2, 0.8]}),
    ({"state": 2, "questions": {"q": SCORE}, "labels": {"q": 1}}, {"q": [0.1, 0.7, 0.2]}),
    ({"state": 3, "questions": {"q": CHOICE}, "labels": {"q": "b"}}, {"q": [0.9, 0.05, 0.05]}),
]


@pytest.fixture
def hand_report():
    items = suite_items([line for line, _ in HAND])
    return build_report(items, answered(items, [p for _, p in HAND]))


def test_overall_metrics_match_the_hand_computed_values(hand_report):
    overall = hand_report["overall"]
    assert overall["questions"] == 4
    assert overall["accuracy"]["value"] == pytest.approx(0.5)
    assert overall["nll"]["value"] == pytest.approx(1.413748, abs=1e-6)
    assert overall["brier"]["value"] == pytest.approx(0.87875, abs=1e-6)
    assert overall["ece"]["value"] == pytest.approx(0.625, abs=1e-6)


def test_per_type_metrics_match_the_hand_computed_values(hand_report):
    by_type = hand_report["by_type"]
    assert set(by_type) == {"choice", "noul", "score"}
    choice = by_type["choice"]
    assert (choice["questions"], choice["accuracy"]["value"]) == (2, 0.5)
    assert choice["nll"]["value"] == pytest.approx(1.844440, abs=1e-6)
    assert choice["brier"]["value"] == pytest.approx(1.0475, abs=1e-6)
    assert choice["ece"]["value"] == pytest.approx(0.7, abs=1e-6)
    noul = by_type["noul"]
    assert noul["accuracy"]["value"] == 0.0          # p(true)=.8 decides true; the label is false
    assert noul["nll"]["value"] == pytest.approx(math.log(5), abs=1e-6)
    score = by_type["score"]
    assert score["accuracy"]["value"] == 1.0
    assert score["brier"]["value"] == pytest.approx(0.14, abs=1e-6)
    # One question: every bootstrap draw is that question, so the interval is a point.
    assert score["nll"]["ci95"] == [pytest.approx(0.356675, abs=1e-6)] * 2


def test_ece_averages_within_a_bin_before_taking_the_gap():
    # conf .62 right and .64 wrong share bin 9 (9.3 and 9.6 of 15): accuracy .5, confidence .63,
    # so ECE = 2/2 * |.5 - .63| = .13 (taking each gap alone would give (.38 + .64)/2 = .51).
    lines = [{"state": i, "questions": {"q": CHOICE}, "labels": {"q": label}} for i, label in enumerate("ab")]
    items = suite_items(lines)
    report = build_report(items, answered(items, [{"q": [0.62, 0.2, 0.18]}, {"q": [0.64, 0.2, 0.16]}]))
    assert report["overall"]["ece"]["value"] == pytest.approx(0.13, abs=1e-6)
    [only_bin] = report["overall"]["reliability"]
    assert only_bin["count"] == 2 and only_bin["bin"] == [pytest.approx(0.6), pytest.approx(10 / 15, abs=1e-6)]
    assert only_bin["confidence"] == pytest.approx(0.63) and only_bin["accuracy"] == 0.5


def test_a_certain_miss_has_a_finite_nll_at_the_floor():
    items = suite_items([{"state": 0, "questions": {"q": NOUL}, "labels": {"q": True}}])
    report = build_report(items, answered(items, [{"q": [1.0, 0.0]}]))
    assert report["overall"]["nll"]["value"] == pytest.approx(-math.log(metrics.P_FLOOR), abs=1e-6)
    assert report["overall"]["brier"]["value"] == 2.0


def test_confidence_bins_are_equal_width_and_one_goes_in_the_last():
    assert [metrics.confidence_bin(c) for c in (0.0, 1 / 15 - 1e-9, 1 / 15, 0.5, 0.999, 1.0)] == [0, 0, 1, 7, 14, 14]


def test_percentile_interval_interpolates_between_ranks():
    # 2.5% of the way along 0..4 is position 0.1; 97.5% is 3.9.
    assert metrics.percentile_interval([4.0, 0.0, 2.0, 1.0, 3.0]) == [pytest.approx(0.1), pytest.approx(3.9)]


def test_bootstrap_resamples_whole_items():
    # Item 0 has two right answers, item 1 two wrong ones. Resampling items, a draw's accuracy can
    # only be 0, .5 or 1; resampling questions one by one would also give .25 and .75.
    seen = set()

    def record(multiplicity):
        value = group.metrics(multiplicity)
        seen.add(value["accuracy"])
        return value

    lines = [{"state": i, "questions": {"x": CHOICE, "y": CHOICE}, "labels": {"x": "a", "y": "a"}}
             for i in range(2)]
    items = suite_items(lines)
    records = answered(items, [{"x": [0.8, 0.1, 0.1], "y": [0.7, 0.2, 0.1]},
                               {"x": [0.1, 0.8, 0.1], "y": [0.2, 0.7, 0.1]}])
    scored = [s for item in items for s in metrics.score_item(item, records[item.index]["result"])]
    group = metrics.Group(scored, {0: 0, 1: 1})
    metrics.bootstrap({"g": record}, 2, resamples=200)
    assert seen == {0.0, 0.5, 1.0}


def test_the_report_is_the_same_bytes_whatever_order_the_results_arrived_in():
    lines = [{"state": i, "questions": {"q": CHOICE, "u": NOUL}, "labels": {"q": "abc"[i % 3], "u": i % 2 == 0}}
             for i in range(30)]
    items = suite_items(lines)
    probabilities = [{"q": [0.2 + 0.01 * i, 0.5, 0.3 - 0.01 * i], "u": [0.3 + 0.02 * i, 0.7 - 0.02 * i]}
                     for i in range(30)]
    records = answered(items, probabilities)
    shuffled = {k: records[k] for k in sorted(records, key=lambda k: (k * 7) % 30)}
    assert list(shuffled) != list(records)
    first = report_json(build_report(items, records))
    assert report_json(build_report(items, shuffled)) == first
    ci = json.loads(first)["overall"]["accuracy"]["ci95"]
    assert ci[0] < json.loads(first)["overall"]["accuracy"]["value"] < ci[1]


# Two choice questions asked together, as the starter model's team and priority are:
#   team      item 0 p=(.9,.05,.05) label a right; item 1 p=(.6,.3,.1) label b wrong  -> accuracy .5
#   priority  item 0 p=(.4,.35,.25) label a right; item 1 p=(.7,.2,.1)  label a right -> accuracy 1
#   team ECE: bins 13 and 9, one question each: (|1-.9| + |0-.6|)/2 = .35
#   priority ECE: bins 6 and 10: (|1-.4| + |1-.7|)/2 = .45; choice (both): accuracy .75
TWO_CHOICES = [
    ({"state": 0, "questions": {"team": CHOICE, "priority": CHOICE}, "labels": {"team": "a", "priority": "a"}},
     {"team": [0.9, 0.05, 0.05], "priority": [0.4, 0.35, 0.25]}),
    ({"state": 1, "questions": {"team": CHOICE, "priority": CHOICE}, "labels": {"team": "b", "priority": "a"}},
     {"team": [0.6, 0.3, 0.1], "priority": [0.7, 0.2, 0.1]}),
]


def two_choices_report():
    items = suite_items([line for line, _ in TWO_CHOICES])
    return build_report(items, answered(items, [p for _, p in TWO_CHOICES]))


def test_per_question_figures_keep_apart_the_questions_a_type_merges():
    report = two_choices_report()
    assert report["by_type"]["choice"]["accuracy"]["value"] == 0.75
    assert list(report["by_question"]) == ["priority", "team"]
    team, priority = report["by_question"]["team"], report["by_question"]["priority"]
    assert (team["qid"], team["type"], team["questions"]) == ("team", "choice", 2)
    assert team["accuracy"]["value"] == 0.5 and priority["accuracy"]["value"] == 1.0
    assert team["ece"]["value"] == pytest.approx(0.35, abs=1e-6)
    assert priority["ece"]["value"] == pytest.approx(0.45, abs=1e-6)
    assert priority["nll"]["value"] == pytest.approx((-math.log(0.4) - math.log(0.7)) / 2, abs=1e-6)
    assert [b["count"] for b in team["reliability"]] == [1, 1]
    assert team["accuracy"]["ci95"] == [0.0, 1.0] and set(team) >= set(report["overall"])


def test_per_question_figures_leave_the_existing_fields_as_they_were(hand_report):
    # The fields a resume or a compare reads are what they were before by_question was added.
    assert set(hand_report) == {"format", "suite", "items", "complete", "models", "overall", "by_type",
                                "by_question", "method"}
    assert hand_report["by_type"]["choice"]["ece"]["value"] == pytest.approx(0.7, abs=1e-6)
    assert set(hand_report["by_type"]["choice"]) == {"questions", "errors_by_code", *metrics.METRICS, "reliability"}


def test_a_question_id_asked_as_two_types_is_named_with_its_type(hand_report):
    # HAND asks `q` as a choice, a noul and a score question.
    assert list(hand_report["by_question"]) == ["q (choice)", "q (noul)", "q (score)"]
    assert hand_report["by_question"]["q (choice)"]["ece"]["value"] == pytest.approx(0.7, abs=1e-6)
    assert hand_report["by_question"]["q (noul)"]["qid"] == "q"


def test_failed_requests_are_counted_per_question_too():
    from jevany_client.eval.results import error_record
    lines = [line for line, _ in TWO_CHOICES] + [
        {"state": 2, "questions": {"refund": NOUL, "team": CHOICE}, "labels": {"refund": True, "team": "c"}}]
    items = suite_items(lines)
    records = answered(items[:2], [p for _, p in TWO_CHOICES])
    records[2] = error_record(items[2], "invalid_request", "refused")
    report = build_report(items, records)
    assert report["by_question"]["team"]["errors_by_code"] == {"invalid_request": 1}
    assert report["by_question"]["priority"]["errors_by_code"] == {}
    refund = report["by_question"]["refund"]
    assert (refund["questions"], refund["type"], refund["accuracy"]["value"]) == (0, "noul", None)
    assert refund["errors_by_code"] == {"invalid_request": 1}


def test_the_summary_lists_the_questions_of_a_type_that_has_several():
    from jevany_client.eval.report import summary
    lines = summary(two_choices_report()).splitlines()
    assert [line.split()[0] for line in lines[2:7]] == ["questions", "overall", "choice", "priority", "team"]
    assert lines[5].startswith("  priority ") and lines[6].startswith("  team ")
    assert "0.500 [0.000, 1.000]" in lines[6]


def test_a_type_with_one_question_gets_no_repeated_row(hand_report):
    from jevany_client.eval.report import summary
    rows = summary(hand_report).splitlines()[3:]
    assert [row.split()[0] for row in rows[:4]] == ["overall", "choice", "noul", "score"]
    assert not any(row.startswith("  ") for row in rows)


def test_an_item_that_failed_is_done_and_only_items_with_no_record_are_not_done():
    # A failed item has its record: rerunning the suite would not run it again, so it is an error, not "not done";
    # not_done counts only the items with no record at all (the ones a rerun picks up).
    from jevany_client.eval.results import error_record
    items = suite_items([line for line, _ in HAND])
    records = answered(items[:2], [p for _, p in HAND[:2]])
    records[2] = error_record(items[2], "invalid_request", "refused")
    report = build_report(items, records)
    assert report["items"] == {"answered": 2, "errors": 1, "not_done": 1}
    assert report["complete"] is False


def test_a_bootstrap_draw_counts_an_item_as_often_as_it_was_drawn():
    draws = []

    def record(multiplicity):
        draws.append(list(multiplicity))
        return {"accuracy": 0.0}

    metrics.bootstrap({"g": record}, 3, resamples=50)
    assert len(draws) == 50 and all(sum(d) == 3 for d in draws)
    assert any(max(d) >= 2 for d in draws)              # with replacement: some item drawn twice


def test_the_interval_of_one_value_is_that_value():
    assert metrics.percentile_interval([0.25]) == [0.25, 0.25]
