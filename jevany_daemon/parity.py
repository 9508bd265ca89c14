"""Compare two sets of decide results for the same requests: how far apart, and which decisions moved.

Every check downstream reads `max_abs_diff <= tolerance`, so anything that is
not a clean comparison makes that check fail: a NaN or infinity on either
side makes it NaN (Python's max() would skip a NaN that does not come
first), and a question or option present on one side only makes it infinite.

answer_problems() holds one result to its request the way a caller would:
every answer through JevAny's self-check, and no NaN or infinity anywhere.
"""
import math

from jevany_client.answers import validate_answer
from jevany_client.errors import InternalError
from jevany_client.schema import parse_decision


def exact_part(result: dict) -> tuple:
    """What --batch-invariant keeps to the last bit: the answers and the token counts (compared with ==;
    `batch` and `latency_ms` describe the pass, not the answer)."""
    return result["answers"], result["usage"]


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


def non_finite(value, path: str = "") -> list[str]:
    """The path of every NaN or infinity anywhere in a decoded reply (the wire must never carry one)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "."]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite(v, f"{path}.{k}")]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in non_finite(v, f"{path}[{i}]")]
    return []


def answer_problems(body: dict, result: dict) -> list[str]:
    """What a caller could not trust in result as the answer to body; empty when nothing.

    A question missing or extra, an answer that fails JevAny's self-check
    (keys, ranges, sum, argmax, score), a non-finite number anywhere.
    """
    questions = parse_decision(body).questions
    answers = result.get("answers", {})
    found = [f"answers hold {sorted(answers)}, the request asked {sorted(q.qid for q in questions)}"] \
        if set(answers) != {q.qid for q in questions} else []
    for q in questions:
        try:
            validate_answer(q, answers.get(q.qid))
        except InternalError as exc:
            found.append(exc.message)
    return found + [f"non-finite number at {p}" for p in non_finite(result)]
