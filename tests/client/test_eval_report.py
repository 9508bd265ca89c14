"""REPORT.json beyond the metrics: rounding, errors by the questions they left unscored, the suite's digest."""
import json

from jevany_client.eval.report import build_report, rounded, suite_digest, summary
from jevany_client.eval.results import error_record
from jevany_client.eval.suite import parse_item

from .test_eval_metrics import CHOICE, HAND, NOUL, answered, suite_items


def test_floats_keep_eight_significant_digits_however_small():
    assert rounded(1.234567891e-9) == 1.2345679e-09
    assert rounded(123456.789123) == 123456.79
    assert rounded({"x": [0.1 + 0.2, float("nan")], "n": 3}) == {"x": [0.3, None], "n": 3}
    report = build_report(*_hand())
    assert report["method"]["nll_floor"] == 1e-12


def _hand():
    items = suite_items([line for line, _ in HAND])
    return items, answered(items, [p for _, p in HAND])


def test_a_failed_item_counts_once_overall_and_once_per_labelled_question():
    lines = [{"state": 0, "questions": {"q": CHOICE, "free": NOUL, "u": NOUL}, "labels": {"q": "a", "u": True}},
             {"state": 1, "questions": {"q": CHOICE, "free": NOUL}, "labels": {"q": "b"}}]
    items = suite_items(lines)
    records = {i.index: error_record(i, "internal", "boom") for i in items}
    report = build_report(items, records)
    assert report["overall"]["errors_by_code"] == {"internal": 2}
    assert report["by_type"]["choice"]["errors_by_code"] == {"internal": 2}
    assert report["by_type"]["noul"]["errors_by_code"] == {"internal": 1}       # `u`; `free` is not scored
    assert "free" not in report["by_question"]
    assert "errors by code: internal 2" in summary(report).splitlines()


def test_the_suite_digest_tells_apart_the_same_lines_at_other_indexes():
    line = json.dumps({"state": 0, "questions": {"u": NOUL}, "labels": {"u": True}}).encode()
    together = [parse_item(line, 0), parse_item(line, 1)]
    apart = [parse_item(line, 0), parse_item(line, 2)]      # a blank line between them
    assert together[1].digest == apart[1].digest
    assert suite_digest(together) != suite_digest(apart)
