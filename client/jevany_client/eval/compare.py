"""Two result files of the same suite, side by side: what changed, and whether it matters.

Differences are "this run minus the other". Decisions and probabilities are
compared on every question (labelled or not) of the items both runs
answered; the metrics are compared on their labelled questions, with a
paired bootstrap: each draw reweights the same items in both runs, so the
interval is that of the difference itself, not of two separate estimates.
"""

import math
from collections.abc import Iterable

from . import metrics
from .results import is_ok
from .suite import Item, decision

EXAMPLES = 20    # changed decisions listed in the report, the first by index


def compare_runs(items: list[Item], this: dict[int, dict], other: dict[int, dict]) -> dict:
    both = [i for i in items if _ok(this, i) and _ok(other, i)]
    changes, diffs = [], []
    for item in both:
        mine, theirs = this[item.index]["result"]["answers"], other[item.index]["result"]["answers"]
        for question in item.request.questions:
            p, q = mine[question.qid]["probabilities"], theirs[question.qid]["probabilities"]
            diffs.extend(abs(float(p[k]) - float(q[k])) for k in question.keys)
            a, b = decision(question, p), decision(question, q)
            if a != b:
                changes.append({"index": item.index, "question": question.qid, "this": a, "other": b})
    return {
        "items": {"both_answered": len(both),
                  "this_only": sum(1 for i in items if _ok(this, i) and not _ok(other, i)),
                  "other_only": sum(1 for i in items if _ok(other, i) and not _ok(this, i))},
        "decisions": {"questions": sum(len(i.request.questions) for i in both),
                      "changed": len(changes), "examples": changes[:EXAMPLES]},
        "probabilities": {"max_abs_diff": nan_aware_max(diffs),
                          "mean_abs_diff": sum(diffs) / len(diffs) if diffs else None,
                          "non_finite": sum(1 for d in diffs if not math.isfinite(d))},
        "paired": _paired(both, this, other),
        "direction": "this run minus the other",
    }


def nan_aware_max(values: Iterable[float]) -> float | None:
    """The largest value, or NaN if any value is NaN; None for no values.

    Python's max() keeps its first argument whenever a comparison with NaN is
    false, so max([0.0, nan, 1e-9]) is 1e-9: a broken answer would vanish."""
    best = None
    for value in values:
        if math.isnan(value):
            return math.nan
        if best is None or value > best:
            best = value
    return best


def _ok(records: dict[int, dict], item: Item) -> bool:
    return item.index in records and is_ok(records[item.index])


def _paired(both: list[Item], this: dict[int, dict], other: dict[int, dict]) -> dict:
    unit_of = {item.index: u for u, item in enumerate(both)}
    runs = [metrics.by_type(s for i in both for s in metrics.score_item(i, records[i.index]["result"]))
            for records in (this, other)]
    groups = {name: (metrics.Group(runs[0][name], unit_of), metrics.Group(runs[1][name], unit_of))
              for name in runs[0]}

    def difference(pair):
        def statistic(multiplicity=None):
            a, b = pair[0].metrics(multiplicity), pair[1].metrics(multiplicity)
            return None if a is None else {m: a[m] - b[m] for m in metrics.METRICS}
        return statistic

    intervals = metrics.bootstrap({name: difference(pair) for name, pair in groups.items()}, len(both))
    out = {}
    for name, (a, b) in groups.items():
        mine, theirs, diff = a.metrics(), b.metrics(), difference((a, b))()
        if mine is None:
            continue        # no labelled question answered by both runs
        out[name] = {"questions": len(a.scored)} | {
            m: {"this": mine[m], "other": theirs[m], "diff": diff[m], "ci95": intervals[name].get(m)}
            for m in metrics.METRICS}
    return out


def summary(comparison: dict) -> str:
    items, decisions, probs = comparison["items"], comparison["decisions"], comparison["probabilities"]
    lines = [f"compared {items['both_answered']} items answered in both runs "
             f"({items['this_only']} answered only here, {items['other_only']} only in the other)",
             f"decisions changed: {decisions['changed']} of {decisions['questions']} questions",
             f"|dp|: max {_number(probs['max_abs_diff'])}, mean {_number(probs['mean_abs_diff'])}"
             + (f"  ({probs['non_finite']} NON-FINITE)" if probs["non_finite"] else "")]
    for name, section in comparison["paired"].items():
        cells = [f"{m} {section[m]['diff']:+.4f}" + (
            f" [{section[m]['ci95'][0]:+.4f}, {section[m]['ci95'][1]:+.4f}]" if section[m]["ci95"] else "")
            for m in metrics.METRICS]
        lines.append(f"{name} ({section['questions']} q), this - other: " + ", ".join(cells))
    return "\n".join(lines)


def _number(value) -> str:
    return "-" if value is None else f"{value:.3g}"
