"""Texts tokenized by pieces where the tokenizer always cuts, each piece's tokens remembered.

A fast tokenizer's pre-tokenizer cuts a text into words and its model (BPE)
tokenizes each word alone, so a text cut where the pre-tokenizer always cuts
has the ids of its pieces joined. Pieces repeat far more than texts do: a
prompt's answer line and options recur in every prompt, a state's lines in
each of its questions' prompts, a reply's keys in every reply. A pass then
tokenizes only the pieces no pass has tokenized lately, all in one batched
call, and joins the rest from memory (LRU, bounded by bytes).

Where the pre-tokenizer always cuts is argued, not guessed, and only for the
splits argued here: the Qwen family's (Qwen2's and Qwen3's pattern, Qwen3.5's
with marks beside letters) and Llama 3's (cl100k's, digits in threes). Every
match of each is one of: a contraction ('s ...); letters (and marks) after at
most one character that is no line break, letter or digit; a digit (or up to
three); an optional space, then characters that are neither whitespace,
letters nor digits, then line breaks; or whitespace alone. So no match holds
a character that is not whitespace followed by a space or tab, nor a line
break followed by a character that is not whitespace, and the tokenizer cuts:

- LINES: after a line break followed by a character that is not whitespace;
- WORDS: before a space or tab that follows a character that is not whitespace.

Python's ``\\s`` holds every character the tokenizer's does (and some control
characters besides), so a cut found with Python's classes is one the
tokenizer makes too.

The rest of the pipeline must not join what the split cuts: the normalizer is
none or NFC (a space and a line break are starters that compose with nothing,
so NFC never works across them); the split is followed only by byte-level
mapping with no regex of its own; the model is BPE without dropout; and no
added token holds whitespace or strips it (added tokens are cut out first:
one holding whitespace could span a cut, one that strips would take the
whitespace beside it). Anything else (or a probe that disagrees with the
whole text's tokens) leaves the caller tokenizing whole texts, as before.

Lines also remember their words (``Words``): a line no pass has seen is
usually made of words that passes have, and putting it together from them
costs a dictionary lookup a word, where the tokenizer costs its
pre-tokenizer's regex a character. A line with a word not known is
tokenized whole, with offsets, and each of its words learnt from the tokens
that lie within it (the cut at words makes every token lie within one).
Once the memory knows a vocabulary, a line mostly of unknown words (ids,
hashes, numbers) is tokenized without offsets and teaches nothing: its words
would seldom come again, and offsets cost the tokenizer more.
"""
import json
import re
import sys
from collections import OrderedDict

LINES = re.compile(r"(?<=\n)(?=\S)")
WORDS = re.compile(r"(?<=\S)(?=[ \t])")

_SPLITS = frozenset({
    # Qwen2, Qwen2.5, Qwen3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    # Qwen3.5: marks join letters
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
    # Llama 3 (cl100k)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
    r"|\s+",
})
# Texts whose pieces must join to the whole text's tokens, at both kinds of cut: line breaks and spaces
# beside punctuation, digits, marks, Unicode spaces, control characters Python calls whitespace and the
# tokenizer may not, CRLF, contractions.
_PROBES = ("a\nb", "}\n\nb c", "x \n y\n\n\nz", "end.\n- item\n  indented\n\tTab", "a\u3000b \u00a0c\u2028d e",
           "a\x1cb \x1dc\n\x1ed", "e\u0301 \u0301x\n\u0301y", "it's 'S 'll\n's", "12 345\n6789 0", "\r\nx\ry \r\n\r\nz",
           '{"q0": {"type": "noul", "noul": 0}, "k": [0, 0]}', "émoji ✓ ‹im_start|> and <no special>\n\nAnswer:",
           "Options:\nA. No\nB. Yes\n\nAnswer with the ID:", "   \n  \n", "", " ", "\n")
BUDGET = 16 << 20     # bytes of remembered pieces (lines of prompts), as estimated by _size
WORDS_BUDGET = 4 << 20     # bytes of remembered words of lines (Words), the same estimate
VOCABULARY = 1024     # words a memory learns from every line before it learns only from lines mostly known


def cuts_hold(backend) -> bool:
    """Whether a tokenizers.Tokenizer cuts at LINES and WORDS as argued above (and its probes agree)."""
    try:
        normalizer = backend.normalizer
        if normalizer is not None and json.loads(normalizer.__getstate__()) != {"type": "NFC"}:
            return False
        pre = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}
        steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        if len(steps) != 2:
            return False
        split, byte_level = steps
        if not (split.get("type") == "Split" and split.get("pattern", {}).get("Regex") in _SPLITS
                and split.get("behavior") == "Isolated" and not split.get("invert")):
            return False
        if not (byte_level.get("type") == "ByteLevel" and not byte_level.get("add_prefix_space")
                and not byte_level.get("use_regex")):
            return False
        if type(backend.model).__name__ != "BPE" or backend.model.dropout:
            return False
        for token in backend.get_added_tokens_decoder().values():
            if token.lstrip or token.rstrip or token.single_word or any(c.isspace() for c in token.content):
                return False
        for cut in (LINES, WORDS):
            pieces = [cut.split(p) for p in _PROBES]
            flat = [s for ps in pieces for s in ps]
            ids = iter(e.ids for e in backend.encode_batch(flat, add_special_tokens=False))
            joined = [[i for _ in ps for i in next(ids)] for ps in pieces]
            if joined != [e.ids for e in backend.encode_batch(list(_PROBES), add_special_tokens=False)]:
                return False
    except Exception:   # noqa: BLE001 - a tokenizer these checks cannot read is tokenized whole
        return False
    return True


def fast_backend(tokenizer):
    """A transformers tokenizer's tokenizers.Tokenizer, or None for a slow tokenizer."""
    return getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None


def _size(piece: str, value) -> int:
    """Roughly what a remembered piece holds, in bytes: the text as stored (4 bytes a character where
    one needs them), its entry, and per token a reference and an int (and an offset where kept)."""
    if not isinstance(value, tuple):
        return sys.getsizeof(piece) + 100
    return sys.getsizeof(piece) + 140 + (36 + (36 if value[1] is not None else 0)) * len(value[0])


class Piecewise:
    """Texts' tokens by pieces cut at `cut` (LINES or WORDS), remembered LRU within `budget` bytes.

    ``encode`` gives ids, and how many tokens end by a character; ``count`` only how many tokens. One
    instance does one of them (what it remembers differs)."""

    def __init__(self, backend, cut: re.Pattern, budget: int = BUDGET, words: "Words | None" = None):
        self.backend, self.cut, self.budget, self.words = backend, cut, budget, words
        self._known: OrderedDict[str, object] = OrderedDict()
        self._bytes = 0

    @classmethod
    def build(cls, tokenizer, cut: re.Pattern, budget: int = BUDGET,
              words: "Words | None" = None) -> "Piecewise | None":
        """For a transformers tokenizer; None unless it is fast and its cuts hold. With `words` (cut at
        LINES, encoding), new lines are put together from remembered words where they can be."""
        backend = fast_backend(tokenizer)
        return cls(backend, cut, budget, words) if backend is not None and cuts_hold(backend) else None

    def encode(self, texts: list[str], ends: list[int]) -> list[tuple[list[int], int]]:
        """Each text's ids, and how many of its leading tokens end at or before character ends[i]."""
        parts = [self.cut.split(t) for t in texts]
        # Where each end falls: (piece, its start); only those pieces' tokens need their offsets.
        at = [_piece_at(pieces, end) for pieces, end in zip(parts, ends)]
        needs = {parts[i][k] for i, (k, _) in enumerate(at) if k < len(parts[i])}
        known = self._known
        self._learn(parts, lambda p: p not in known or (p in needs and known[p][1] is None), stops_of=needs)
        out = []
        for pieces, (k, start), end in zip(parts, at, ends):
            ids = []
            for i, piece in enumerate(pieces):
                got = known[piece]
                if i == k:
                    before = len(ids) + tokens_before(got[1], end - start)
                ids += got[0]
            out.append((ids, len(ids) if k == len(pieces) else before))
        self._trim()
        return out

    def count(self, texts: list[str]) -> list[int]:
        """Each text's number of tokens."""
        parts = [self.cut.split(t) for t in texts]
        known = self._known
        self._learn(parts, lambda p: p not in known)
        out = [sum(known[p] for p in pieces) for pieces in parts]
        self._trim()
        return out

    def _learn(self, parts: list[list[str]], missing, stops_of: set | None = None) -> None:
        """Every piece known: those `missing` tokenized (batched: one call for the pieces whose offsets
        are kept, one without offsets for the rest), and every one marked used. Remembered: a count
        (stops_of None), else (ids, their end offsets for the pieces in stops_of, else None)."""
        known, counting, stops_of = self._known, stops_of is None, stops_of or set()
        todo = [p for p in dict.fromkeys(p for pieces in parts for p in pieces) if missing(p)]
        learnt, teach = [], {}
        if self.words is not None and not counting:
            learnt, teach, todo = self.words.lines(todo, stops_of)
        # Offsets cost the tokenizer more: taken only for pieces whose stops are kept or words learnt.
        with_offsets = [*teach, *(p for p in todo if p in stops_of)]
        plain = [p for p in todo if p not in stops_of]
        backend = self.backend
        for p, e in zip(with_offsets, backend.encode_batch(with_offsets, add_special_tokens=False)):
            ids, offsets = e.ids, e.offsets
            if p in teach:
                self.words.learn(teach[p], ids, offsets)
            learnt.append((p, ids, [stop for _, stop in offsets] if p in stops_of else None))
        learnt += [(p, e.ids, None) for p, e in zip(plain, backend.encode_batch_fast(plain, add_special_tokens=False))]
        for piece, ids, stops in learnt:
            if piece in known:
                self._bytes -= _size(piece, known[piece])
            # Tuples of ints, not lists: the garbage collector stops tracking a tuple of untracked
            # values, so a memory of a hundred thousand pieces costs its full collections nothing.
            value = len(ids) if counting else (tuple(ids), None if stops is None else tuple(stops))
            known[piece] = value
            self._bytes += _size(piece, value)
        for pieces in parts:
            for p in pieces:
                known.move_to_end(p)

    def _trim(self) -> None:
        while self._bytes > self.budget and self._known:
            piece, value = self._known.popitem(last=False)
            self._bytes -= _size(piece, value)


class Words:
    """The words of lines (cut at WORDS), each with its ids and their end offsets within it, remembered
    within `budget` bytes; when over it, the older half is forgotten (a word in use is soon learnt again)."""

    def __init__(self, budget: int = WORDS_BUDGET, vocabulary: int = VOCABULARY):
        self.budget, self.vocabulary = budget, vocabulary
        self._known: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._bytes = 0

    def lines(self, lines: list[str], stops_of: set) -> tuple[list, dict, list]:
        """(learnt, teach, rest): learnt, (line, ids, stops or None) for the lines made of known words,
        stops where the line is in stops_of; teach, {line: its words} for the lines to learn words from;
        rest, the lines to tokenize and learn nothing from."""
        known, learnt, teach, rest = self._known, [], {}, []
        learning = len(known) < self.vocabulary
        for line in lines:
            words = WORDS.split(line)
            got = [known.get(w) for w in words]
            if None not in got:
                learnt.append((line, [i for ids, _ in got for i in ids],
                               _joined_stops(words, got) if line in stops_of else None))
            elif learning or got.count(None) * 2 <= len(got):
                teach[line] = words
            else:
                rest.append(line)
        return learnt, teach, rest

    def learn(self, words: list[str], ids: list[int], offsets: list[tuple[int, int]]) -> None:
        """Each word's tokens, from the whole line's tokens and their offsets. Nothing is learnt from a
        line whose tokens do not each lie within one word (the cut argued above says they do)."""
        found, k, start = [], 0, 0
        for word in words:
            end, first = start + len(word), k
            while k < len(ids) and offsets[k][1] <= end:
                if offsets[k][0] < start or offsets[k][0] >= offsets[k][1]:
                    return
                k += 1
            found.append((word, (tuple(ids[first:k]), tuple(stop - start for _, stop in offsets[first:k]))))
            start = end
        if k != len(ids):
            return
        known = self._known
        for word, value in found:
            if word not in known:
                known[word] = value
                self._bytes += _size(word, value)
        if self._bytes > self.budget:
            for word in list(known)[:len(known) // 2]:
                self._bytes -= _size(word, known.pop(word))


def _joined_stops(words: list[str], got: list) -> list[int]:
    """A line's token end offsets, from its words' (each relative to the word's start)."""
    stops, start = [], 0
    for word, (_, ends) in zip(words, got):
        stops += [start + stop for stop in ends]
        start += len(word)
    return stops


def _piece_at(pieces: list[str], end: int) -> tuple[int, int]:
    """(index, start) of the piece holding character `end` (the first that reaches past it); (len, total)
    when none does."""
    start = 0
    for k, piece in enumerate(pieces):
        if start + len(piece) > end:
            return k, start
        start += len(piece)
    return len(pieces), start


def tokens_before(stops, end: int) -> int:
    """How many leading tokens, by their end offsets, end at or before character `end`: walks only
    those, and the one after them."""
    n = 0
    for stop in stops:
        if stop > end:
            break
        n += 1
    return n
