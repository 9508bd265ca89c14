"""A pass's probabilities to its callers' replies: answers, JevAny's self-check, usage.

JevAny checks every answer before it returns it, and so do we: no readout
fault (unnormalised, out of range, not finite) reaches a caller; a request
whose answer fails gets InternalError, alone.

``usage.output_tokens`` is JevAny's accounting: the tokens of the answers'
JSON in JevAny's shape (default separators, ASCII escaping), without special
tokens. Counting
it by calling the tokenizer per reply costs more host time than the rest of
shaping together, so a pass counts all its replies in one batched call of
the tokenizer's backend (prompts.encode_texts: the same ids), and
remembers the counts of texts it has seen: answers rounded to two decimals
(noul) repeat exactly, so their count is a lookup.
"""
import json
from collections import OrderedDict

from jevany_client.answers import jevany_answers, shape_answer, validate_answer
from jevany_client.errors import InternalError

from .prompts import encode_texts

REMEMBERED = 4096     # distinct answer texts whose token counts are kept


def counted_text(answers: dict) -> str:
    """The text JevAny counts as output: its answers' JSON, in its shape (without our additions)."""
    return json.dumps(jevany_answers(answers))


class OutputTokens:
    """Token counts of answer texts, batched per pass, remembered LRU."""

    def __init__(self, tokenizer, remembered: int = REMEMBERED):
        self.tokenizer, self.remembered = tokenizer, remembered
        self._known: OrderedDict[str, int] = OrderedDict()

    def counts(self, texts: list[str]) -> list[int]:
        todo = [t for t in dict.fromkeys(texts) if t not in self._known]
        for text, ids in zip(todo, encode_texts(self.tokenizer, todo)):
            self._known[text] = len(ids)
        out = []
        for text in texts:
            self._known.move_to_end(text)
            out.append(self._known[text])
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
