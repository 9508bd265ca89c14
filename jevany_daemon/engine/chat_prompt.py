"""The choice readout's chat prompt, rendered once per model: constant token ids around what varies.

Rendering the chat template (Jinja) and tokenizing the whole prompt for
every question repeats the same work: the system prompt and the chat
markup are the same in every prompt. A fast tokenizer cuts its input at
added tokens (the template's special tokens) and tokenizes the text between
them independently, so a prompt's ids are the ids of its pieces joined,
when the pieces are cut exactly at those tokens. ``ChatPrompt`` renders the
template once around a sentinel user message, keeps the ids of the
constant pieces, and tokenizes per question only the piece that holds the
user message (from the last special token before it to the first after it),
for every question of a hand-over in one batched call (by its lines, each
remembered, where the tokenizer provably cuts between lines, and a new line
put together from remembered words where it can be: piecewise.py).

Exact or not at all: the template must render the same text around any
user message, the tokens it cuts at must not strip the whitespace beside
them, and the result must equal tokenizing whole prompts on probes; else
(or with a slow tokenizer, or no template) ``ChatPrompt.build`` returns None
and prompts are rendered and tokenized whole, as before.
"""
from dataclasses import dataclass

from .piecewise import LINES, Piecewise, Words, tokens_before

_SENTINELS = ("\x00jevany-user-a\x00", "\x00jevany-user-b\x00 with more words\n")
_PROBES = ("plain state\n\nask\n\nOptions:\nA. x\n\nAnswer:", " leading space", "\nleading newline and trailing\n",
           "émoji ✓ and ‹im_start|> lookalikes", "")


@dataclass(frozen=True)
class Piece:
    """A prompt's ids: head ids, then the tokens of (opening + user message + closing), then tail ids."""
    head: tuple[int, ...]      # every token before the text piece that holds the user message
    opening: str               # that piece's text before the user message (e.g. "user\n")
    closing: str               # and after it, up to the next special token
    tail: tuple[int, ...]      # every token after the piece


class ChatPrompt:
    def __init__(self, tokenizer, render, piece: Piece):
        self.tokenizer, self.render, self.piece = tokenizer, render, piece
        self.backend = tokenizer.backend_tokenizer
        # The varying piece by its lines, where the tokenizer provably cuts there (piecewise.py).
        self.lines = Piecewise.build(tokenizer, LINES, words=Words())

    @classmethod
    def build(cls, tokenizer, render) -> "ChatPrompt | None":
        """render(user) -> the whole prompt text. None when the constant parts cannot be cut exactly."""
        if not getattr(tokenizer, "is_fast", False) or not hasattr(tokenizer, "backend_tokenizer"):
            return None
        texts = [render(s) for s in _SENTINELS]
        cut = [t.split(s) for t, s in zip(texts, _SENTINELS)]
        if any(len(parts) != 2 for parts in cut) or cut[0] != cut[1]:
            return None          # the template's text depends on the message itself
        before, after = cut[0]
        piece = _piece(tokenizer, before, after)
        if piece is None:
            return None
        prompt = cls(tokenizer, render, piece)
        for probe in _PROBES:
            whole = tokenizer(render(probe), add_special_tokens=False)["input_ids"]
            if prompt.ids([probe], [0])[0][0] != whole:
                return None
        return prompt

    def ids(self, users: list[str], ends: list[int]) -> list[tuple[list[int], int]]:
        """Each user message's prompt ids, and how many of them lie wholly before character ends[i] of
        the message (the markup before it always does, the markup after it never); one batched call."""
        p = self.piece
        texts, shift = [p.opening + u + p.closing for u in users], len(p.opening)
        if self.lines is not None:
            encoded = self.lines.encode(texts, [shift + end for end in ends])
        else:
            encoded = [(e.ids, tokens_before((stop for _, stop in e.offsets), shift + end))
                       for e, end in zip(self.backend.encode_batch(texts, add_special_tokens=False), ends)]
        head, tail = list(p.head), list(p.tail)
        return [(head + ids + tail, len(head) + before) for ids, before in encoded]


def _piece(tokenizer, before: str, after: str) -> Piece | None:
    """Cut before/after at the special tokens nearest the user message; None if that is not exact."""
    specials = sorted({t for t in tokenizer.all_special_tokens if t}, key=len, reverse=True)
    last = max(((before.rfind(t), t) for t in specials if t in before), default=None)
    first = min(((after.find(t), t) for t in specials if t in after), default=None)
    if last is None or first is None:
        return None
    head_text, opening = before[:last[0] + len(last[1])], before[last[0] + len(last[1]):]
    closing, tail_text = after[:first[0]], after[first[0]:]
    for token in (last[1], first[1]):
        added = _added(tokenizer, token)
        if added is None or added.lstrip or added.rstrip or added.single_word:
            return None          # it would take the whitespace beside it: the pieces would not join
    encode = lambda text: tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()
    return Piece(encode(head_text), opening, closing, encode(tail_text))


def _added(tokenizer, content: str):
    for token in tokenizer.added_tokens_decoder.values():
        if token.content == content:
            return token
    return None
