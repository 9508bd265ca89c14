"""The reliability diagram, where matplotlib (the plot extra) is installed."""
import pytest

from jevany_client.eval.plot import plot_reliability
from jevany_client.eval.report import build_report

from .test_eval_metrics import HAND, answered, suite_items


def test_the_reliability_diagram_is_written_as_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    items = suite_items([line for line, _ in HAND])
    report = build_report(items, answered(items, [p for _, p in HAND]))
    path = tmp_path / "reliability.png"
    plot_reliability(report, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
