"""Compare two sets of decide results for the same requests: how far apart, and which decisions moved.

Every check downstream reads `max_abs_diff <= tolerance`, so anything that is
not a clean comparison makes that check fail: a NaN or infinity on either
side makes it NaN (Python's max() would skip a NaN that does not come
first), and a question or option present on one side only makes it infinite.
"""
import math


def worst(values) -> float:
    """The largest difference, NaN if any is NaN (plain max() keeps whichever value came first)."""
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)


def decision(answer: dict) -> str:
    """The key a caller would act on: the chosen option, or the most probable level / truth value."""
    if answer["type"] == "choice":
        return answer["choice"]
    probs = answer["probabilities"]
    return max(probs, key=probs.get)   # first maximum, in key order


def compare(reference: list[dict], other: list[dict]) -> dict:
    """Max and mean absolute probability difference, and every (request index, question id) whose decision changed.

    non_finite counts NaN and infinite probabilities on both sides; mismatched
    lists the (request index, question id) whose questions or options differ.
    """
    diffs, changed, mismatched, non_finite = [], [], [], 0
    for i, (a, b) in enumerate(zip(reference, other, strict=True)):
        ours, theirs = a["answers"], b["answers"]
        for qid in list(ours) + [q for q in theirs if q not in ours]:
            if qid not in ours or qid not in theirs or ours[qid]["probabilities"].keys() != \
                    theirs[qid]["probabilities"].keys():
                mismatched.append((i, qid))
                continue
            p, q = ours[qid]["probabilities"], theirs[qid]["probabilities"]
            non_finite += sum(not math.isfinite(v) for v in (*p.values(), *q.values()))
            diffs += [abs(v - q[k]) for k, v in p.items()]
            if decision(ours[qid]) != decision(theirs[qid]):
                changed.append((i, qid))
    largest = math.inf if mismatched else worst(diffs)
    return {
        "max_abs_diff": math.nan if non_finite else largest,
        "mean_abs_diff": math.fsum(diffs) / len(diffs) if diffs else 0.0,
        "probabilities": len(diffs),
        "non_finite": non_finite,
        "mismatched": mismatched,
        "decisions_changed": changed,
    }
