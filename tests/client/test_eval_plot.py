"""The reliability diagram, where matplotlib (the plot extra) is installed."""
import pytest

from jevany_client.eval import plot
from jevany_client.eval.plot import plot_reliability
from jevany_client.eval.report import build_report

from .test_eval_metrics import CHOICE, HAND, NOUL, answered, suite_items, two_choices_report

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_reliability_diagram_is_written_as_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    items = suite_items([line for line, _ in HAND])
    report = build_report(items, answered(items, [p for _, p in HAND]))
    path = tmp_path / "reliability.png"
    plot_reliability(report, str(path))
    assert path.read_bytes()[:8] == PNG


def test_a_type_with_several_questions_gets_a_panel_per_question():
    report = two_choices_report()
    assert [title for title, _ in plot.panels(report)] == ["overall", "choice", "choice / priority", "choice / team"]
    assert plot.panels(report)[3][1] is report["by_question"]["team"]


def test_a_type_with_one_question_gets_no_repeated_panel():
    items = suite_items([line for line, _ in HAND])
    report = build_report(items, answered(items, [p for _, p in HAND]))
    assert [title for title, _ in plot.panels(report)] == ["overall", "choice", "noul", "score"]
    assert plot.omitted(report) == 0


def many_questions_report(n: int):
    lines = [{"state": i, "questions": {f"c{k:02d}": CHOICE for k in range(n)} | {"u": NOUL},
              "labels": {f"c{k:02d}": "abc"[(i + k) % 3] for k in range(n)} | {"u": True}} for i in range(6)]
    items = suite_items(lines)
    probabilities = [{f"c{k:02d}": [0.6, 0.3, 0.1] for k in range(n)} | {"u": [0.3, 0.7]} for _ in lines]
    return build_report(items, answered(items, probabilities))


def test_question_panels_are_capped_and_the_rest_counted(tmp_path):
    report = many_questions_report(plot.MAX_QUESTION_PANELS + 3)
    titles = [title for title, _ in plot.panels(report)]
    assert titles[:3] == ["overall", "choice", "choice / c00"] and titles[-1] == "noul"
    assert sum(title.startswith("choice / ") for title in titles) == plot.MAX_QUESTION_PANELS
    assert plot.omitted(report) == 3
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    path = tmp_path / "many.png"
    plot_reliability(report, str(path))
    assert path.read_bytes()[:8] == PNG


def test_a_report_written_before_by_question_still_plots(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    report = two_choices_report()
    del report["by_question"]
    assert [title for title, _ in plot.panels(report)] == ["overall", "choice"]
    plot_reliability(report, str(tmp_path / "old.png"))
    assert (tmp_path / "old.png").read_bytes()[:8] == PNG


def test_the_most_asked_questions_get_the_panels_the_cap_allows():
    section = {"reliability": []}
    by_question = {f"c{k:02d}": {"type": "choice", "questions": k + 1, **section} for k in range(14)}
    report = {"overall": section, "by_type": {"choice": section}, "by_question": by_question}
    titles = [title for title, _ in plot.panels(report)]
    assert titles == ["overall", "choice"] + [f"choice / c{k:02d}" for k in range(2, 14)]
    assert plot.omitted(report) == 2
