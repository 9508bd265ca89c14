"""How well decide results match a suite's labels: accuracy and expected calibration error.

Results are decide replies (or None for an item that got an error); a
question counts as right when the decision a caller would act on
(parity.decision) is its label. ECE bins the probability of that decision
in 15 equal-width bins, as the jevany-eval report does.
"""
from __future__ import annotations

import math

from jevany_daemon.parity import decision

ECE_BINS = 15


def label_key(answer_type: str, label) -> str:
    """The probability key a label names: the option key, "true"/"false", or the level index."""
    if answer_type == "noul":
        return "true" if label else "false"
    return str(label)


def outcomes(items: list[dict], results: list[dict | None]) -> list[tuple[str, float, bool]]:
    """(question type, probability of the decision, right?) for every labelled question that was answered."""
    out = []
    for item, result in zip(items, results, strict=True):
        if result is None:
            continue
        for qid, label in item["labels"].items():
            answer = result["answers"][qid]
            chosen = decision(answer)
            out.append((answer["type"], answer["probabilities"][chosen],
                        chosen == label_key(answer["type"], label)))
    return out


def expected_calibration_error(pairs: list[tuple[float, bool]], bins: int = ECE_BINS) -> float:
    """Σ over bins of (share of questions) x |accuracy - mean confidence|."""
    if not pairs:
        return math.nan
    totals = [[0, 0.0, 0] for _ in range(bins)]    # count, confidence sum, right
    for confidence, right in pairs:
        cell = totals[min(bins - 1, int(confidence * bins))]
        cell[0] += 1
        cell[1] += confidence
        cell[2] += right
    return sum(abs(right - conf) for n, conf, right in totals if n) / len(pairs)


def report(items: list[dict], results: list[dict | None]) -> dict:
    """{"overall" and each question type: {questions, accuracy, ece}, "errors": items with no answer}."""
    rows = outcomes(items, results)
    groups = {"overall": rows, **{kind: [r for r in rows if r[0] == kind] for kind in sorted({r[0] for r in rows})}}
    out = {name: {"questions": len(group),
                  "accuracy": sum(r[2] for r in group) / len(group) if group else math.nan,
                  "ece": expected_calibration_error([(r[1], r[2]) for r in group])}
           for name, group in groups.items()}
    out["errors"] = sum(result is None for result in results)
    return out


def format_report(figures: dict) -> str:
    lines = [f"{'':10} {'questions':>9} {'accuracy':>9} {'ECE':>7}"]
    for name, row in figures.items():
        if isinstance(row, dict):
            lines.append(f"{name:10} {row['questions']:>9} {row['accuracy']:>9.3f} {row['ece']:>7.3f}")
    if figures.get("errors"):
        lines.append(f"{figures['errors']} item(s) got an error instead of an answer")
    return "\n".join(lines)
