"""REPORT.json and its printed summary.

The report is a function of the suite and the set of results alone: items
are taken in index order, floats are rounded to DIGITS significant digits
(so a difference of 1e-7 between two runs still shows) and keys are sorted.
The same results give a byte-identical report whatever order they arrived
in, so a resumed run's report equals an uninterrupted one's whenever the
daemon gave the same answers.
"""

import hashlib
import json
import math
from collections import Counter
from typing import Any

from . import metrics
from .errors import EvalError
from .results import is_ok
from .suite import Item

DIGITS = 8
FORMAT = "jevany-eval report 1"


def build_report(items: list[Item], records: dict[int, dict]) -> dict:
    scored = [s for item in items if item.index in records and is_ok(records[item.index])
              for s in metrics.score_item(item, records[item.index]["result"])]
    ambiguous = metrics.ambiguous_ids((q.qid, q.type) for item in items for q in item.scored())
    groups = metrics.by_type(scored)
    questions = metrics.by_question(scored, ambiguous)
    unit_of = {item.index: u for u, item in enumerate(items)}
    built = {name: metrics.Group(members, unit_of) for name, members in groups.items()}
    per_question = {name: metrics.Group(members, unit_of) for name, members in questions.items()}
    statistics = {name: group.metrics for name, group in built.items()}
    statistics.update({("question", name): group.metrics for name, group in per_question.items()})
    intervals = metrics.bootstrap(statistics, len(items))
    failed, failed_questions = _failed_questions(items, records, ambiguous)
    sections = {name: _section(group, intervals[name], failed.get(name, Counter()))
                for name, group in built.items()}
    for name, codes in failed.items():       # a type every answer of which failed
        sections.setdefault(name, _section(None, {}, codes))
    by_question = {name: _section(group, intervals[("question", name)], failed_questions.get(name, Counter()))
                   for name, group in per_question.items()}
    for name, codes in failed_questions.items():
        by_question.setdefault(name, _section(None, {}, codes))
    kinds = {metrics.question_key(q.qid, q.type, ambiguous): (q.qid, q.type)
             for item in items for q in item.scored()}
    for name, section in by_question.items():
        section["qid"], section["type"] = kinds[name]
    answered = sum(1 for r in records.values() if is_ok(r))
    report = {
        "format": FORMAT,
        "suite": {"items": len(items), "sha256": suite_digest(items)},
        "items": {"answered": answered, "errors": len(records) - answered,
                  "not_done": len(items) - len(records)},
        "complete": len(records) == len(items),
        "models": sorted({r["result"].get("model") for r in records.values()
                          if is_ok(r) and isinstance(r["result"].get("model"), str)}),
        "overall": sections.pop("overall"),
        "by_type": sections,
        "by_question": dict(sorted(by_question.items(), key=lambda kv: (kv[1]["type"], kv[1]["qid"]))),
        "method": {
            "ece_bins": metrics.ECE_BINS,
            "nll_floor": metrics.P_FLOOR,
            "bootstrap": {"resamples": metrics.BOOTSTRAP_RESAMPLES, "seed": metrics.BOOTSTRAP_SEED,
                          "unit": "item", "interval": "percentile, 2.5 to 97.5"},
        },
    }
    return rounded(report)


def suite_digest(items: list[Item]) -> str:
    return hashlib.sha256(" ".join(f"{i.index}:{i.digest}" for i in items).encode()).hexdigest()


def _section(group: metrics.Group | None, intervals: dict, errors: Counter) -> dict:
    values = group.metrics() if group is not None else None
    section: dict[str, Any] = {"questions": len(group.scored) if group else 0,
                               "errors_by_code": dict(sorted(errors.items()))}
    for metric in metrics.METRICS:
        section[metric] = {"value": None if values is None else values[metric],
                           "ci95": intervals.get(metric)}
    section["reliability"] = group.reliability() if group is not None else []
    return section


def _failed_questions(items: list[Item], records: dict[int, dict],
                      ambiguous: set[str]) -> tuple[dict[str, Counter], dict[str, Counter]]:
    """Error codes by the labelled questions they left unscored: ('overall' and per type, per question).

    The 'overall' counter counts items (a request fails whole), the others questions.
    """
    failed: dict[str, Counter] = {}
    per_question: dict[str, Counter] = {}
    for item in items:
        record = records.get(item.index)
        if record is None or is_ok(record):
            continue
        code = record["error"]["code"]
        failed.setdefault("overall", Counter())[code] += 1
        for question in item.scored():
            failed.setdefault(question.type, Counter())[code] += 1
            name = metrics.question_key(question.qid, question.type, ambiguous)
            per_question.setdefault(name, Counter())[code] += 1
    return failed, per_question


def rounded(value: Any) -> Any:
    """Floats to DIGITS significant digits; a non-finite float becomes None, which JSON can carry."""
    if isinstance(value, float):
        return float(f"{value:.{DIGITS}g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def report_json(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def write_report(report: dict, path: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(report_json(report))
    except OSError as exc:
        raise EvalError(f"cannot write the report {path}: {exc.strerror or exc}") from None


# -- the printed summary -------------------------------------------------------

def summary(report: dict) -> str:
    items = report["items"]
    lines = [f"{report['suite']['items']} items: {items['answered']} answered, {items['errors']} errors, "
             f"{items['not_done']} not done" + ("" if report["complete"] else "  (INCOMPLETE: run again)")]
    if report["models"]:
        lines.append("model: " + ", ".join(report["models"]))
    rows = [("", "questions", *metrics.METRICS)]
    per_question = report.get("by_question", {})
    for name, section in [("overall", report["overall"]), *sorted(report["by_type"].items())]:
        rows.append((name, str(section["questions"]),
                     *(_cell(section[m]) for m in metrics.METRICS)))
        asked = [(qname, q) for qname, q in per_question.items() if q["type"] == name]
        if len(asked) > 1:                   # one question of a type: its row would repeat the type's
            for qname, q in asked:
                rows.append((f"  {qname}", str(q["questions"]), *(_cell(q[m]) for m in metrics.METRICS)))
    lines.append(_table(rows))
    lines.append("values with 95% bootstrap intervals; ECE over "
                 f"{report['method']['ece_bins']} confidence bins"
                 + ("; indented rows: each question id of a type" if any(
                     r[0].startswith("  ") for r in rows) else ""))
    errors = report["overall"]["errors_by_code"]
    if errors:
        lines.append("errors by code: " + ", ".join(f"{code} {n}" for code, n in errors.items()))
    return "\n".join(lines)


def _cell(metric: dict) -> str:
    value, ci = metric["value"], metric["ci95"]
    if value is None:
        return "-"
    return f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _table(rows: list[tuple]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
