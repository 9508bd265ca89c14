"""usage.output_tokens is JevAny's count: the tokens of the answers as JevAny writes them, nothing of ours.

Whatever replaces the re-tokenization (the host path's rewrite) must give the same number: these pin it
against the tokenizer itself, over varied requests.
"""
import json
import random

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


def random_answers(rng) -> dict:
    """Answers as the engine shapes them, with numbers of every form json.dumps writes: floats long and
    short, exponents, ints, and in a score's legend (the caller's own values) signs, -0.0, bools, nests."""
    def p():
        return rng.choice([rng.random(), rng.random() * 1e-6, 1.0, 0.0, 0.5, rng.random() * 1e-12])
    a, b = p(), p()
    legend = {"0": rng.choice([-3, -0.0, -2.5e-08, 10 ** 30, True, None, "level 10", [1, -1, 0.25]]),
              "1": {"n": rng.randint(0, 10 ** 6), "x": [rng.random(), "7"]}}
    return {
        "c": {"type": "choice", "choice": "a", "confidence": round(a, 2), "probabilities": {"a": a, "b": b}},
        "n": {"type": "noul", "noul": round(b, 2), "probabilities": {"false": 1 - b, "true": b}},
        "s": {"type": "score", "score": round(a + b, 2), "legend": legend,
              "probabilities": {"0": a, "1": b}, "confidence": round(b, 2)},
    }


def test_a_tokenizer_whose_digits_stand_alone_counts_by_skeleton_exactly(loaded_model, monkeypatch):
    # The counts must be the tokenizer's own: JevAny reports those. Random answers are
    # unique texts, so every one tests the skeleton-and-digits sum, not a remembered count.
    from jevany_client.answers import jevany_answers
    from jevany_daemon.engine import shaping

    tokenizer = loaded_model("qwen3", "choice").tokenizer
    counter = shaping.OutputTokens(tokenizer)
    assert counter.by_skeleton      # the tiny tokenizer splits digits one by one, as Qwen's does
    rng = random.Random(3)
    for _ in range(20):
        answers = [random_answers(rng) for _ in range(16)]
        assert counter.counts(answers) == [tokens(tokenizer, jevany_answers(a)) for a in answers]
    # Once a skeleton is known, a pass of new numbers on it costs the tokenizer nothing.
    counter.counts([{"c": random_answers(rng)["c"]}])
    tokenized = []
    real = shaping.encode_texts
    monkeypatch.setattr(shaping, "encode_texts", lambda tok, texts: tokenized.extend(texts) or real(tok, texts))
    assert counter.words is not None        # unknown texts are counted by their words (piecewise.py)
    backend = counter.words.backend
    monkeypatch.setattr(counter.words, "backend", type("Spy", (), {
        "encode_batch": lambda self, texts, **kw: tokenized.extend(texts) or backend.encode_batch(texts, **kw),
        "encode_batch_fast": lambda self, texts, **kw: tokenized.extend(texts) or backend.encode_batch_fast(texts, **kw),
    })())
    fresh = [{"c": random_answers(rng)["c"]} for _ in range(32)]
    assert counter.counts(fresh) == [tokens(tokenizer, jevany_answers(a)) for a in fresh]
    assert tokenized == []


def _merging_tokenizer():
    """A byte-level BPE with GPT-2's pre-tokenizer (digits in runs, a space joined to them), trained on
    numbers so that digits merge."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(5)
    corpus = [json.dumps({"a": rng.random(), "b": [rng.randint(0, 999), rng.random() * 1e-6]}) for _ in range(3000)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)


def test_a_tokenizer_that_merges_digits_is_counted_whole_and_still_exactly():
    from jevany_client.answers import jevany_answers
    from jevany_daemon.engine.shaping import OutputTokens

    tokenizer = _merging_tokenizer()
    assert len(tokenizer("0.123456", add_special_tokens=False)["input_ids"]) < len("0.123456")   # it does merge
    counter = OutputTokens(tokenizer)
    assert not counter.by_skeleton
    rng = random.Random(4)
    answers = [random_answers(rng) for _ in range(24)]
    assert counter.counts(answers) == [tokens(tokenizer, jevany_answers(a)) for a in answers]
