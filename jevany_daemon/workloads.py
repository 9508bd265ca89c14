"""Deterministic synthetic decision requests, for tests, the demo and benchmarks.

Each generator takes a seed and returns wire-format ``decide`` bodies, so the
same request set can be scored in-process and through the daemon.
"""
import copy
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


# About how many tiny-model tokens a word of WORDS costs, so workloads can be
# sized in tokens as the benchmark targets are.
TOKENS_PER_WORD = 2.7


def _words_for(tokens: int) -> int:
    return max(1, round(tokens / TOKENS_PER_WORD))


def _state(rng: random.Random, n_words: int, structured: bool = True):
    if not structured:
        return _text(rng, n_words)
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


def request(rng: random.Random, state_words: int, n_questions: int, instr_words: int = 6,
            structured: bool = True) -> dict:
    kinds = ("choice", "noul", "score")
    return {
        "state": _state(rng, state_words, structured),
        "questions": {f"q{i}": _question(rng, rng.choice(kinds), instr_words) for i in range(n_questions)},
    }


def mixed(n: int, seed: int = 0, min_words: int = 5, max_words: int = 60, max_questions: int = 4) -> list[dict]:
    """Choice, noul and score questions, 1..max_questions per request, varied lengths, nested states."""
    rng = random.Random(seed)
    return [request(rng, rng.randint(min_words, max_words), rng.randint(1, max_questions)) for _ in range(n)]


def short(n: int, seed: int = 0) -> list[dict]:
    """20-40 token states, 1-2 questions."""
    rng = random.Random(seed)
    return [request(rng, _words_for(rng.randint(20, 40)), rng.randint(1, 2), instr_words=3, structured=False)
            for _ in range(n)]


def long_uneven(n: int, seed: int = 0) -> list[dict]:
    """50-400 token states, one question: lengths vary widely, so padding is the cost."""
    rng = random.Random(seed)
    return [request(rng, _words_for(rng.randint(50, 400)), 1, structured=False) for _ in range(n)]


def recurring(n: int, seed: int = 0, questions: int = 9) -> list[dict]:
    """short()'s states, new with every seed, asked questions from one fixed set (the same for every seed):
    an evaluation fleet asking the same questions of new states."""
    fixed_rng = random.Random(5)
    fixed = [_question(fixed_rng, ("choice", "noul", "score")[i % 3], 3) for i in range(questions)]
    out = short(n, seed)
    rng = random.Random(seed)
    for body in out:
        body["questions"] = {qid: copy.deepcopy(rng.choice(fixed)) for qid in body["questions"]}
    return out


def unseen(n: int, seed: int = 0) -> list[dict]:
    """short()'s requests, each state's words replaced by random letters and digits (ids, hashes): text
    that no memory of lines or words holds, whatever came before; the worst case for those memories.
    Half as many words as short()'s: such a word costs the tiny models' tokenizer about twice the tokens,
    so the states keep about short()'s length in tokens."""
    out = short(n, seed)
    rng = random.Random(seed)
    chars = "abcdefghijklmnopqrstuvwxyz0123456789"
    for body in out:
        words = body["state"].split()
        body["state"] = " ".join("".join(rng.choice(chars) for _ in range(rng.randint(3, 9)))
                                 for _ in range(max(1, len(words) // 2)))
    return out


def multi_question(n: int, seed: int = 0) -> list[dict]:
    """Four questions sharing one 300-token state: where running the state once pays."""
    rng = random.Random(seed)
    return [request(rng, _words_for(300), 4, structured=False) for _ in range(n)]


def blend(n: int, seed: int = 0) -> list[dict]:
    """A blend of the others, plus a few requests large enough to fill a pass on their own."""
    rng = random.Random(seed)
    makers = (short, long_uneven, multi_question)
    out = [rng.choice(makers)(1, seed=rng.randrange(1 << 30))[0] for _ in range(n)]
    for i in range(0, n, 16):
        out[i] = request(rng, _words_for(1500), 2, structured=False)
    return out


def same_state(n: int, seed: int = 0, per_state: int = 8) -> list[dict]:
    """One question per request, per_state requests about each 600-token state, states interleaved:
    request j asks about state j % states, as an eval suite's concurrent workers would."""
    rng = random.Random(seed)
    states = [_text(rng, _words_for(600)) for _ in range(max(1, n // per_state))]
    return [{"state": states[j % len(states)], "questions": {"q": _question(rng, rng.choice(("choice", "noul", "score")), 6)}}
            for j in range(n)]


def agent(sessions: int, turns: int, seed: int = 0, start: tuple[int, int] = (100, 1400),
          step: tuple[int, int] = (40, 80)) -> list[dict]:
    """Agent sessions whose state (a transcript) grows by step tokens a turn, from start tokens.

    Turn-major: request t * sessions + s is session s's turn t, so a client
    given every sessions-th request plays one session in order.
    """
    rng = random.Random(seed)
    transcripts = [_text(rng, _words_for(rng.randint(*start))) for _ in range(sessions)]
    out = []
    for _ in range(turns):
        for s in range(sessions):
            out.append({"state": transcripts[s], "questions": {"next": _question(rng, "choice", 6)}})
            transcripts[s] += " " + _text(rng, _words_for(rng.randint(*step)))
    return out


WORKLOADS = {"short": short, "long_uneven": long_uneven, "multi_question": multi_question, "mixed": blend}
