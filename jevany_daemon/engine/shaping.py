"""A pass's probabilities to its callers' replies: answers, JevAny's self-check, usage.

JevAny checks every answer before it returns it, and so do we: no readout
fault (unnormalised, out of range, not finite) reaches a caller; a request
whose answer fails gets InternalError, alone.

``usage.output_tokens`` is JevAny's accounting: the tokens of the answers'
JSON in JevAny's shape (default separators, ASCII escaping), without special
tokens. Tokenizing every reply again costs more host time than the rest of
shaping together, and the part that changes from pass to pass is almost all
numbers: a probability is written with up to 17 digits, so no two replies
are the same text. Where the tokenizer is proven (below) to give every
character of a number a token of its own, a reply's count is its
*skeleton's* (the same JSON with each such number written as 0, which
repeats whenever the questions do, so its count is a lookup) plus each
number's characters but one. Elsewhere a pass counts its replies' whole
texts in one batched call of the tokenizer's backend (prompts.encode_texts:
the same ids). Either way the counts of texts seen are remembered, LRU, and
a text not seen is counted by its words where the tokenizer provably cuts
before spaces (piecewise.py): only words no reply has used lately are
tokenized.

The proof, made once per tokenizer (``digits_stand_alone``): every
character a number can hold (0-9 . e + -) is one token alone; the
pre-tokenizer cuts each of them from its neighbours, in the places JSON puts
numbers; and on probes covering every pair of adjacent characters a number
can hold, the whole text's count equals the skeleton's plus the digits'.
Qwen2's pre-tokenizer splits digits one by one, so tokenizers built on it
should pass (the tests' tiny tokenizer, which uses it, does); one that merges
digits (GPT-2's, Llama 3's groups of three) does not, and its replies' whole
texts are counted. A number is counted this way only when its text starts
with a digit: a sign would join the space before it in one piece.
"""
import json
import math
from collections import OrderedDict

from jevany_client.answers import jevany_answers, shape_answer, validate_answer
from jevany_client.errors import InternalError

from .piecewise import WORDS, Piecewise, fast_backend
from .prompts import encode_texts

REMEMBERED = 4096     # distinct texts whose token counts are kept
WORDS_BUDGET = 2 << 20      # bytes of remembered words of replies (piecewise.Piecewise)
NUMBER_CHARS = "0123456789.e+-"
# Where json.dumps puts a number: after ": " or "[" or ", ", before "," or "}" or "]".
_PLACES = (('{"a": ', "}"), ('{"a": ', ', "b": 1}'), ('{"a": [', "]}"), ('{"a": [1, ', ", 2]}"))


def _probe_numbers() -> list[str]:
    """Number texts in which every pair of adjacent characters a float's or int's repr can hold occurs."""
    pairs = "".join(f"{a}{b}" for a in "0123456789" for b in "0123456789")
    return ["0", "7", "1.0", "0.5", "0.30000000000000004", "1e-05", "3.5e-07", "1e+20", "2.5e+16",
            "0." + pairs, pairs, *(f"{d}.{d}e-{d}{d}" for d in "0123456789"), *(f"{d}e+{d}" for d in "123456789")]


def digits_stand_alone(tokenizer) -> bool:
    """True where a number's token count in JSON is exactly its length, wherever JSON puts it (see above)."""
    backend = fast_backend(tokenizer)
    if backend is None:
        return False
    try:
        if any(len(ids) != 1 for ids in encode_texts(tokenizer, list(NUMBER_CHARS))):
            return False
        numbers = _probe_numbers()
        texts = [left + n + right for left, right in _PLACES for n in ["0", *numbers]]
        pre = backend.pre_tokenizer
        if pre is not None:
            for left, right in _PLACES:
                for n in numbers:
                    text = left + n + right
                    cuts = {start for _, (start, _) in pre.pre_tokenize_str(text)}
                    if not all(at in cuts for at in range(len(left), len(left) + len(n) + 1)
                               if at < len(text)):
                        return False     # a number's character shares a piece with another
        counts = [len(ids) for ids in encode_texts(tokenizer, texts)]
    except Exception:   # noqa: BLE001 - an unusual tokenizer is simply counted whole
        return False
    per_place = len(numbers) + 1
    for p in range(len(_PLACES)):
        zero = counts[p * per_place]
        for i, n in enumerate(numbers, start=1):
            if counts[p * per_place + i] != zero + len(n) - 1:
                return False
    return True


def _skeleton(value, extra: list[int]):
    """value with each number whose text starts with a digit written as 0; extra gets its characters but one."""
    if isinstance(value, dict):
        return {k: _skeleton(v, extra) for k, v in value.items()}
    if isinstance(value, list):
        return [_skeleton(v, extra) for v in value]
    kind = type(value)
    if kind is float and math.isfinite(value) or kind is int:
        text = float.__repr__(value) if kind is float else int.__repr__(value)     # what json.dumps writes
        if text[0].isdigit():
            extra.append(len(text) - 1)
            return 0
    return value


class OutputTokens:
    """Token counts of replies' answers as JevAny writes them, batched per pass, remembered LRU."""

    def __init__(self, tokenizer, remembered: int = REMEMBERED):
        self.tokenizer, self.remembered = tokenizer, remembered
        self.by_skeleton = digits_stand_alone(tokenizer)
        # A text not seen is counted by its words, where the tokenizer provably cuts before spaces
        # (piecewise.py): a reply's keys, types and option names recur across replies that differ.
        self.words = Piecewise.build(tokenizer, WORDS, budget=WORDS_BUDGET)
        self._known: OrderedDict[str, int] = OrderedDict()

    def counts(self, answers: list[dict]) -> list[int]:
        """Each request's answers (as shaped, ours included) → JevAny's usage.output_tokens."""
        texts, extra = [], []
        for a in answers:
            written = jevany_answers(a)
            if self.by_skeleton:
                digits: list[int] = []
                texts.append(json.dumps(_skeleton(written, digits)))
                extra.append(sum(digits))
            else:
                texts.append(json.dumps(written))
                extra.append(0)
        todo = [t for t in dict.fromkeys(texts) if t not in self._known]
        if todo:
            counted = (self.words.count(todo) if self.words is not None
                       else [len(ids) for ids in encode_texts(self.tokenizer, todo)])
            self._known.update(zip(todo, counted))
        out = []
        for text, more in zip(texts, extra):
            self._known.move_to_end(text)
            out.append(self._known[text] + more)
        while len(self._known) > self.remembered:
            self._known.popitem(last=False)
        return out


def answers_of(questions, probs) -> dict | InternalError:
    """One request's answers, each checked as JevAny checks it; InternalError if one fails."""
    answers = {}
    try:
        for q, p in zip(questions, probs):
            answers[q.qid] = shape_answer(q, p)
            validate_answer(q, answers[q.qid])
    except InternalError as exc:
        return exc
    return answers
