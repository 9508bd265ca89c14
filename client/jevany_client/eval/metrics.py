"""Accuracy, NLL, Brier and ECE of scored questions, with bootstrap intervals over items.

For one labelled question with probabilities p over its options and label y:
- correct: the decision (the first most probable option) is y;
- NLL: -ln p(y), p(y) floored at P_FLOOR so one confident miss stays finite;
- Brier: sum over options o of (p(o) - [o is y])^2;
- confidence: the top probability, max over o of p(o).
A group's value is the mean over its questions; ECE is
sum over bins b of |B_b|/n * |accuracy(B_b) - mean confidence(B_b)|, with
ECE_BINS equal-width confidence bins.

Intervals: the percentile bootstrap (2.5th to 97.5th), resampling whole
items with replacement (an item's questions share a state, so they are not
independent), BOOTSTRAP_RESAMPLES times from a fixed seed: the same results
give the same intervals, run after run.
"""

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import mul

from .suite import Item, decision

ECE_BINS = 15
P_FLOOR = 1e-12
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 20240515
METRICS = ("accuracy", "nll", "brier", "ece")


@dataclass(frozen=True)
class Scored:
    """One labelled question of one answered item."""

    index: int          # the item's
    qid: str
    type: str
    decision: str
    label: str
    p_label: float
    confidence: float
    brier: float

    @property
    def correct(self) -> bool:
        return self.decision == self.label

    @property
    def nll(self) -> float:
        return -math.log(max(self.p_label, P_FLOOR))


def score_item(item: Item, result: dict) -> list[Scored]:
    """The labelled questions of one answered item (its answers already passed the self-check)."""
    scored = []
    for question in item.scored():
        probabilities = result["answers"][question.qid]["probabilities"]
        label = item.label_key(question)
        scored.append(Scored(
            index=item.index, qid=question.qid, type=question.type,
            decision=decision(question, probabilities), label=label,
            p_label=float(probabilities[label]),
            confidence=max(float(p) for p in probabilities.values()),
            brier=sum((float(p) - (key == label)) ** 2 for key, p in probabilities.items()),
        ))
    return scored


def confidence_bin(confidence: float) -> int:
    return min(int(confidence * ECE_BINS), ECE_BINS - 1)


class Group:
    """Questions measured together (one type, or all), ready to be reweighted by a bootstrap draw.

    unit_of maps an item index to its position in the resampled list of items. The sums are
    kept per item, since a draw weighs an item's questions alike: a draw then costs one
    product per item (and per item in each confidence bin), not one per question.
    """

    def __init__(self, scored: list[Scored], unit_of: dict[int, int]):
        self.scored = scored
        per_unit: dict[int, list[float]] = {}
        # ECE as sum_b |sum_{q in b} w_q (correct_q - confidence_q)| / n: one sparse vector per bin.
        bins: dict[int, dict[int, float]] = {}
        for s in scored:
            unit = unit_of[s.index]
            sums = per_unit.setdefault(unit, [0.0, 0.0, 0.0, 0.0])
            for k, value in enumerate((1.0, float(s.correct), s.nll, s.brier)):
                sums[k] += value
            gaps = bins.setdefault(confidence_bin(s.confidence), {})
            gaps[unit] = gaps.get(unit, 0.0) + float(s.correct) - s.confidence
        self.units = list(per_unit)
        self.count, self.correct, self.nll, self.brier = (
            [per_unit[u][k] for u in self.units] for k in range(4))
        self.bins = {b: (list(gaps), list(gaps.values())) for b, gaps in sorted(bins.items())}
        self._members = {b: [s for s in scored if confidence_bin(s.confidence) == b] for b in self.bins}

    def metrics(self, multiplicity: list[int] | None = None) -> dict[str, float] | None:
        """Each metric's mean, every item counted `multiplicity[unit]` times (default once);
        None when the draw holds none of this group's questions."""
        if multiplicity is None:
            multiplicity = _Ones()
        w = [multiplicity[u] for u in self.units]
        n = sum(map(mul, w, self.count))
        if n == 0:
            return None
        ece = sum(abs(sum(map(mul, map(multiplicity.__getitem__, units), gaps)))
                  for units, gaps in self.bins.values())
        return {
            "accuracy": sum(map(mul, w, self.correct)) / n,
            "nll": sum(map(mul, w, self.nll)) / n,
            "brier": sum(map(mul, w, self.brier)) / n,
            "ece": ece / n,
        }

    def reliability(self) -> list[dict]:
        """The non-empty confidence bins: their range, count, mean confidence and accuracy."""
        out = []
        for b, members in self._members.items():
            out.append({
                "bin": [b / ECE_BINS, (b + 1) / ECE_BINS],
                "count": len(members),
                "confidence": sum(s.confidence for s in members) / len(members),
                "accuracy": sum(s.correct for s in members) / len(members),
            })
        return out


class _Ones:
    """Every item once: the point estimate."""

    def __getitem__(self, unit: int) -> int:
        return 1


Statistic = Callable[[list[int]], dict[str, float] | None]


def bootstrap(statistics: dict[str, Statistic], n_units: int,
              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict[str, dict]:
    """{name: {metric: [low, high]}}: every statistic sees the same draws of n_units items.

    A draw where a statistic is undefined (None: none of its questions drawn) is left out of
    that statistic's interval; a statistic with no defined draw gets no interval.
    """
    rng = random.Random(seed)
    draws: dict[str, dict[str, list[float]]] = {name: {} for name in statistics}
    units = range(n_units)
    for _ in range(resamples if n_units else 0):
        multiplicity = [0] * n_units
        for u in rng.choices(units, k=n_units):
            multiplicity[u] += 1
        for name, statistic in statistics.items():
            values = statistic(multiplicity)
            if values is not None:
                for metric, value in values.items():
                    draws[name].setdefault(metric, []).append(value)
    return {name: {metric: percentile_interval(values) for metric, values in by_metric.items()}
            for name, by_metric in draws.items()}


def percentile_interval(values: list[float], level: float = 0.95) -> list[float]:
    ordered = sorted(values)
    tail = (1 - level) / 2
    return [_quantile(ordered, tail), _quantile(ordered, 1 - tail)]


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks, as numpy's default does."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def by_type(scored: Iterable[Scored]) -> dict[str, list[Scored]]:
    """'overall' and each question type present, in a fixed order."""
    scored = list(scored)
    groups = {"overall": scored}
    for qtype in ("choice", "noul", "score"):
        members = [s for s in scored if s.type == qtype]
        if members:
            groups[qtype] = members
    return groups


def question_key(qid: str, qtype: str, ambiguous: set[str]) -> str:
    """A question's name in by_question: its id, or 'id (type)' when the suite asks that id as two types."""
    return f"{qid} ({qtype})" if qid in ambiguous else qid


def ambiguous_ids(pairs: Iterable[tuple[str, str]]) -> set[str]:
    """The question ids that come with more than one type among (qid, type) pairs."""
    types: dict[str, set[str]] = {}
    for qid, qtype in pairs:
        types.setdefault(qid, set()).add(qtype)
    return {qid for qid, seen in types.items() if len(seen) > 1}


def by_question(scored: Iterable[Scored], ambiguous: set[str] = frozenset()) -> dict[str, list[Scored]]:
    """Each question id present (named by question_key), sorted by type then id.

    The starter suite's `team` and `priority` are both choice questions: by_type merges
    them, this keeps them apart.
    """
    groups: dict[tuple[str, str], list[Scored]] = {}
    for s in scored:
        groups.setdefault((s.type, s.qid), []).append(s)
    return {question_key(qid, qtype, ambiguous): groups[(qtype, qid)] for qtype, qid in sorted(groups)}
