"""Deterministic synthetic decision requests, for tests, the demo and benchmarks.

Each generator takes a seed and returns wire-format ``decide`` bodies, so the
same request set can be scored in-process and through the daemon.
"""
import random

WORDS = (
    "agent user order account balance payment refund delivery package status "
    "customer ticket priority issue login error network server request reply "
    "price total item cart discount shipping address city country region time "
    "date week month year morning evening policy rule limit score level value "
    "risk safe unsafe valid invalid open closed pending approved rejected high "
    "low medium small large fast slow new old first last next previous report"
).split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _state(rng: random.Random, n_words: int) -> dict:
    # A nested state, as real callers send: rendering must handle every JSON kind.
    return {
        "summary": _text(rng, max(1, n_words - 8)),
        "facts": {"count": rng.randint(0, 99), "ratio": round(rng.random(), 3), "flag": rng.random() < 0.5},
        "tags": [rng.choice(WORDS) for _ in range(3)],
    }


def _question(rng: random.Random, kind: str, instr_words: int) -> dict:
    instructions = _text(rng, instr_words)
    if kind == "choice":
        names = rng.sample(WORDS, rng.randint(2, 5))
        return {"type": "choice", "instructions": instructions,
                "criteria": {n: (_text(rng, 3) if rng.random() < 0.5 else None) for n in names}}
    if kind == "noul":
        q = {"type": "noul", "instructions": instructions}
        if rng.random() < 0.5:
            q["criteria"] = {"false": _text(rng, 2), "true": _text(rng, 2)}
        return q
    return {"type": "score", "instructions": instructions,
            "criteria": [_text(rng, 2) for _ in range(rng.randint(2, 5))]}


def request(rng: random.Random, state_words: int, n_questions: int, instr_words: int = 6) -> dict:
    kinds = ("choice", "noul", "score")
    return {
        "state": _state(rng, state_words),
        "questions": {f"q{i}": _question(rng, rng.choice(kinds), instr_words) for i in range(n_questions)},
    }


def mixed(n: int, seed: int = 0, min_words: int = 5, max_words: int = 60, max_questions: int = 4) -> list[dict]:
    """Choice, noul and score questions, 1..max_questions per request, varied lengths."""
    rng = random.Random(seed)
    return [request(rng, rng.randint(min_words, max_words), rng.randint(1, max_questions)) for _ in range(n)]


def short(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [request(rng, rng.randint(12, 24), rng.randint(1, 2), instr_words=3) for _ in range(n)]


def long_uneven(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [request(rng, rng.randint(40, 330), 1) for _ in range(n)]


def multi_question(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [request(rng, 250, 4) for _ in range(n)]


WORKLOADS = {"short": short, "long_uneven": long_uneven, "multi_question": multi_question, "mixed": mixed}
