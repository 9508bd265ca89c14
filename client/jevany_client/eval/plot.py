"""The reliability diagram: accuracy against confidence, bin by bin, from a report.

One panel overall, one per question type and, where a type has several
question ids, one per question id (at most MAX_QUESTION_PANELS of them, the
most asked first). In each panel the bars are each bin's accuracy, the dashed
diagonal is perfect calibration, and the gap from the bar's top to the bin's
mean confidence (a black tick) is filled: red where the model is
overconfident (confidence above accuracy), green where it is underconfident.
Below, the questions per bin. The legend sits above the panels, never on them.

matplotlib is the optional extra `jevany-client[plot]`: the client itself
stays small, and a run that asks for a plot without it is refused before it
starts rather than after it has finished.
"""

from .errors import EvalError

MISSING = ("--plot needs matplotlib, which jevany-client does not install by default: "
           "pip install 'jevany-client[plot]' (or pip install matplotlib)")


def check_plotting() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise EvalError(MISSING) from None


ACCURACY, OVER, UNDER, COUNT = "#9ebcda", "#d62728", "#2ca02c", "#8c8c8c"
MAX_QUESTION_PANELS = 12
COLUMNS = 4


def panels(report: dict) -> list[tuple[str, dict]]:
    """(title, section): overall, then each type followed by its question ids when it has several,
    at most MAX_QUESTION_PANELS question panels in all (the most scored questions first)."""
    per_question = report.get("by_question", {})
    of_type = {qtype: [name for name, q in per_question.items() if q["type"] == qtype]
               for qtype in report["by_type"]}
    several = [name for names in of_type.values() if len(names) > 1 for name in names]
    kept = set(sorted(several, key=lambda name: -per_question[name]["questions"])[:MAX_QUESTION_PANELS])
    out = [("overall", report["overall"])]
    for qtype, section in sorted(report["by_type"].items()):
        out.append((qtype, section))
        out += [(f"{qtype} / {name}", per_question[name]) for name in of_type[qtype] if name in kept]
    return out


def omitted(report: dict) -> int:
    """The question ids that would have a panel but for MAX_QUESTION_PANELS."""
    per_type: dict[str, int] = {}
    for q in report.get("by_question", {}).values():
        per_type[q["type"]] = per_type.get(q["type"], 0) + 1
    return max(0, sum(n for n in per_type.values() if n > 1) - MAX_QUESTION_PANELS)


def plot_reliability(report: dict, path: str) -> None:
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")       # a file, never a window: eval runs on servers
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D

    shown = panels(report)
    columns = min(COLUMNS, len(shown))
    rows = -(-len(shown) // columns)
    figure = plt.figure(figsize=(4.2 * columns, 4.6 * rows + 0.9))
    outer = figure.add_gridspec(rows, columns, hspace=0.38, wspace=0.3,
                                top=1 - 0.9 / (4.6 * rows + 0.9), bottom=0.35 / (4.6 * rows + 0.9) + 0.03)
    width = 1 / report["method"]["ece_bins"]
    for k, (name, section) in enumerate(shown):
        cell = outer[k // columns, k % columns].subgridspec(2, 1, height_ratios=[3, 1], hspace=0.08)
        top = figure.add_subplot(cell[0])
        bottom = figure.add_subplot(cell[1], sharex=top)
        _panel(top, bottom, name, section, width)
    hidden = omitted(report)
    handles = [Patch(facecolor=ACCURACY, edgecolor="#2b5c8a", label="accuracy in the bin"),
               Line2D([], [], color="black", marker="_", markersize=14, linestyle="none", markeredgewidth=2,
                      label="mean confidence in the bin"),
               Patch(facecolor=OVER, alpha=0.55, label="gap: overconfident (confidence > accuracy)"),
               Patch(facecolor=UNDER, alpha=0.55, label="gap: underconfident (confidence < accuracy)"),
               Line2D([], [], color="grey", linestyle="--", label="perfect calibration")]
    figure.legend(handles=handles, loc="upper center", ncol=3 if columns < 3 else 5, fontsize="small",
                  frameon=False, bbox_to_anchor=(0.5, 1 - 0.05 / (4.6 * rows + 0.9)))
    if hidden:
        figure.text(0.5, 0.005, f"{hidden} more question ids not drawn (see by_question in the report)",
                    ha="center", va="bottom", fontsize="small", color="dimgray")
    try:
        figure.savefig(path, dpi=100)
    except OSError as exc:
        raise EvalError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)


def _panel(top, bottom, name: str, section: dict, width: float) -> None:
    bins = section["reliability"]
    centres = [(b["bin"][0] + b["bin"][1]) / 2 for b in bins]
    accuracy = [b["accuracy"] for b in bins]
    confidence = [b["confidence"] for b in bins]
    top.plot([0, 1], [0, 1], "--", color="grey", linewidth=1, zorder=1)
    top.bar(centres, accuracy, width=width * 0.9, color=ACCURACY, edgecolor="#2b5c8a", linewidth=1, zorder=2)
    gaps = [c - a for a, c in zip(accuracy, confidence)]
    top.bar(centres, gaps, bottom=accuracy, width=width * 0.9, zorder=3, alpha=0.55,
            color=[OVER if g > 0 else UNDER for g in gaps], edgecolor=[OVER if g > 0 else UNDER for g in gaps],
            linewidth=1)
    top.scatter(centres, confidence, marker="_", s=(width * 0.9 * 230) ** 2 / 4, color="black",
                linewidths=2, zorder=4)
    top.set_title(f"{name}\n{section['questions']} questions, accuracy {_number(section['accuracy']['value'])}, "
                  f"ECE {_number(section['ece']['value'])}", fontsize="medium")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1.02)
    top.set_ylabel("accuracy")
    top.tick_params(labelbottom=False)
    if not bins:
        top.text(0.3, 0.75, "no scored questions", ha="center", va="center", color="dimgray",
                 transform=top.transAxes)
    bottom.bar(centres, [b["count"] for b in bins], width=width * 0.9, color=COUNT)
    bottom.set_xlim(0, 1)
    bottom.set_ylim(bottom=0, top=None if bins else 1)
    bottom.set_xlabel("confidence (top probability)")
    bottom.set_ylabel("questions")


def _number(value) -> str:
    return "-" if value is None else f"{value:.3f}"
