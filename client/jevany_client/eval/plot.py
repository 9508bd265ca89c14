"""The reliability diagram: accuracy against confidence, bin by bin, from a report.

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


def plot_reliability(report: dict, path: str) -> None:
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")       # a file, never a window: eval runs on servers
    import matplotlib.pyplot as plt

    panels = [("overall", report["overall"]), *sorted(report["by_type"].items())]
    figure, axes = plt.subplots(2, len(panels), figsize=(4 * len(panels), 6.5), squeeze=False,
                                gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
    width = 1 / report["method"]["ece_bins"]
    for column, (name, section) in enumerate(panels):
        top, bottom = axes[0][column], axes[1][column]
        bins = section["reliability"]
        centres = [(b["bin"][0] + b["bin"][1]) / 2 for b in bins]
        top.bar(centres, [b["accuracy"] for b in bins], width=width * 0.9, color="#4878a8", label="accuracy")
        top.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], "o", color="#c44e52",
                 label="mean confidence")
        top.plot([0, 1], [0, 1], "--", color="grey", linewidth=1)
        ece = section["ece"]["value"]
        top.set_title(f"{name}: {section['questions']} questions, ECE {_number(ece)}")
        top.set_ylim(0, 1)
        top.set_ylabel("accuracy")
        top.legend(loc="upper left", fontsize="small")
        bottom.bar(centres, [b["count"] for b in bins], width=width * 0.9, color="#8c8c8c")
        bottom.set_xlim(0, 1)
        bottom.set_xlabel("confidence (top probability)")
        bottom.set_ylabel("questions")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=100)
    except OSError as exc:
        raise EvalError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)


def _number(value) -> str:
    return "-" if value is None else f"{value:.3f}"
