"""Compare two sets of decide results for the same requests: how far apart, and which decisions moved."""


def decision(answer: dict) -> str:
    """The key a caller would act on: the chosen option, or the most probable level / truth value."""
    if answer["type"] == "choice":
        return answer["choice"]
    probs = answer["probabilities"]
    return max(probs, key=probs.get)   # first maximum, in key order


def compare(reference: list[dict], other: list[dict]) -> dict:
    """Max and mean absolute probability difference, and every (request index, question id) whose decision changed."""
    diffs, changed = [], []
    for i, (a, b) in enumerate(zip(reference, other, strict=True)):
        for qid, ans in a["answers"].items():
            other_ans = b["answers"][qid]
            diffs += [abs(p - other_ans["probabilities"][k]) for k, p in ans["probabilities"].items()]
            if decision(ans) != decision(other_ans):
                changed.append((i, qid))
    return {
        "max_abs_diff": max(diffs, default=0.0),
        "mean_abs_diff": sum(diffs) / len(diffs) if diffs else 0.0,
        "probabilities": len(diffs),
        "decisions_changed": changed,
    }
