"""usage.output_tokens is JevAny's count: the tokens of the answers as JevAny writes them, nothing of ours.

Whatever replaces the re-tokenization (the host path's rewrite) must give the same number: these pin it
against the tokenizer itself, over varied requests.
"""
import json

import pytest

from jevany_daemon import workloads

ODD = {"state": {"note": "crème brûlée, 证据 and \"quotes\"", "n": [1, 2.5, None]}, "questions": {
    "": {"type": "noul", "criteria": {"true": "yes ✓"}},
    "where": {"type": "choice", "criteria": {"café": None, "": "blank name", "b\\c": {"nested": [1, True]}}},
    "level": {"type": "score", "criteria": ["low", {"mid": ["x", 2]}, 3, None]},
}}


def as_jevany_writes_it(body: dict, answers: dict) -> dict:
    """JevAny's api.py to_answers, restated from the raw probabilities (noul's p(true) read from ours)."""
    out = {}
    for qid, question in body["questions"].items():
        got, kind = answers[qid], question["type"]
        p = list(got["probabilities"].values())
        if kind == "noul":
            out[qid] = {"type": "noul", "noul": round(p[1], 2)}
        elif kind == "choice":
            keys, k = list(question["criteria"]), len(p)
            confidence = 1.0 if k == 1 else (max(p) - 1 / k) / (1 - 1 / k)
            out[qid] = {"type": "choice", "choice": keys[p.index(max(p))], "confidence": round(confidence, 2),
                        "probabilities": dict(zip(keys, p))}
        else:
            mode = p.index(max(p))
            spread = sum(pi * abs(i - mode) for i, pi in enumerate(p)) / (len(p) - 1)
            out[qid] = {"type": "score", "score": round(sum(i * pi for i, pi in enumerate(p)), 2),
                        "legend": {str(i): c for i, c in enumerate(question["criteria"])},
                        "probabilities": {str(i): pi for i, pi in enumerate(p)}, "confidence": round(1 - spread, 2)}
    return out


def tokens(tokenizer, value) -> int:
    return len(tokenizer(json.dumps(value), add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("readout", ["choice", "pointer"])
def test_output_tokens_count_the_answers_as_jevany_writes_them(make_engine, loaded_model, readout):
    engine, tokenizer = make_engine("qwen3", readout), loaded_model("qwen3", readout).tokenizer
    for body in [ODD, *workloads.short(6, seed=4)]:
        result = engine.decide(body)
        written = as_jevany_writes_it(body, result["answers"])
        assert result["usage"]["output_tokens"] == tokens(tokenizer, written)
        # ours (noul's probabilities) are never billed
        if any(q["type"] == "noul" for q in body["questions"].values()):
            assert tokens(tokenizer, result["answers"]) > result["usage"]["output_tokens"]
