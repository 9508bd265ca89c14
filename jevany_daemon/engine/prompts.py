"""How a decision request becomes tokens: native JevAny delimiters, or a choice-token chat prompt.

Both encoders produce the same shape, an ``Encoded``: a prefix every question
shares, then one branch per question with the positions its readout reads.
The layouts (rows, packed) only ever see that shape, so any prompt runs in
any layout.
"""
import json
import re
import string
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from jevany_client.errors import ContextLengthError, JevanyError
from jevany_client.render import native_options, render
from jevany_client.schema import DecisionRequest, Question

from .chat_prompt import ChatPrompt
from .piecewise import fast_backend, tokens_before

# Option IDs of the choice-token readout: A-Z then a-z.
CHOICE_IDS = string.ascii_uppercase + string.ascii_lowercase

CHOICE_SYSTEM_PROMPT = (
    "You are a calibration engine. You never answer in prose. You are given a state, a question "
    "and a numbered set of options, and you choose exactly one option. You reply with that "
    "option's case-sensitive ID and nothing else \u2014 a single character, no words, no "
    "punctuation, no explanation."
)
CHOICE_ANSWER_LINE = "Answer with the case-sensitive ID of exactly one option, and nothing else:"

_NAMED_SPECIAL = re.compile(r"<\|([A-Za-z0-9_]+)\|>")


@dataclass(frozen=True)
class Branch:
    tokens: tuple[int, ...]
    readout: tuple[int, ...]   # positions inside the branch whose hidden states the readout reads


@dataclass(frozen=True)
class Encoded:
    prefix: tuple[int, ...]    # shared by every question (the state, or the common chat prefix)
    branches: tuple[Branch, ...]
    input_tokens: int          # what usage reports (JevAny's accounting, per prompt style)
    # How many leading prefix tokens follow from the state alone (the prompt's
    # head and the state, never a question): what the prefix cache keys on, so
    # requests about one state share an entry whatever they ask. None: all of it.
    stem_length: int | None = None
    # Whose prefix-cache entries it may use and keep (the daemon's salt for its connection):
    # requests of different tenants never share an entry, so a hit reveals nothing of another's.
    tenant: str | None = None

    @property
    def stem(self) -> tuple[int, ...]:
        return self.prefix if self.stem_length is None else self.prefix[: self.stem_length]

    @property
    def row_lengths(self) -> list[int]:
        return [len(self.prefix) + len(b.tokens) for b in self.branches]

    @property
    def packed_length(self) -> int:
        return len(self.prefix) + sum(len(b.tokens) for b in self.branches)


@dataclass(frozen=True)
class Limits:
    """Token limits in force, already capped by the context window."""
    state: int
    branch: int
    window: int
    choice: int | None = None   # the choice readout's longest prompt, answer included (None: no cap of its own)


def max_token_chars(tokenizer) -> int:
    """An upper bound on the characters one token covers (a token's vocabulary string is never shorter).

    Dividing a text's length by it gives a lower bound on its token count, so
    a text far over a limit is refused without tokenizing megabytes of it.
    """
    return max(1, max(map(len, tokenizer.get_vocab()), default=1))


def _at_least(text: str, per_token: int) -> int:
    return -(-len(text) // per_token)


def encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens: one batched call on a fast tokenizer's backend
    (what the tokenizer's own __call__ does, without its per-call Python), else one call each."""
    ids: list[list[int]] = [[] for _ in texts]
    todo = [i for i, t in enumerate(texts) if t]
    if not todo:
        return ids
    backend = fast_backend(tokenizer)
    if backend is not None:
        for i, e in zip(todo, backend.encode_batch([texts[i] for i in todo], add_special_tokens=False)):
            ids[i] = e.ids
    else:
        for i in todo:
            ids[i] = tokenizer(texts[i], add_special_tokens=False)["input_ids"]
    return ids


class Failed(NamedTuple):
    """A request of a batch its encoder refused (its limits), in place of its Encoded."""
    error: JevanyError


def escape_named_specials(text: str) -> str:
    # <|name|> can never reach the tokenizer intact, whatever the vocabulary holds.
    return _NAMED_SPECIAL.sub("<\u00a6\\1\u00a6>", text)


def _defuse(token: str, first: str, replacement: str) -> str:
    return token.replace(first, replacement, 1)


class NativeEncoder:
    """JevAny's packed record: [STATE] state, then per question [Q] instr ([OPT] opt [/OPT])* [DECIDE]."""

    def __init__(self, tokenizer, decision_tokens: tuple[str, ...], symbols: list[str] | None = None):
        self.tokenizer = tokenizer
        ids = [tokenizer.convert_tokens_to_ids(t) for t in decision_tokens]
        self.state_id, self.question_id, self.open_id, self.close_id, self.decide_id = ids
        self.delimiters = decision_tokens
        self.symbols = symbols    # lm_token: option i is written "SYM_i: option"
        self.per_token = max_token_chars(tokenizer)

    def safe_text(self, text: str) -> str:
        text = escape_named_specials(text)
        for token in self.delimiters:
            text = text.replace(token, _defuse(_defuse(token, "<", "<\u00a6"), ">", "\u00a6>"))
        return text

    def encode(self, request: DecisionRequest, limits: Limits) -> Encoded:
        out = self.encode_many([request], limits)[0]
        if isinstance(out, Failed):
            raise out.error
        return out

    def encode_many(self, requests: list[DecisionRequest], limits: Limits) -> list["Encoded | Failed"]:
        """Every request's record; each piece of caller text tokenized on its own, all in one batched call."""
        plans, texts = [], []
        for request in requests:
            try:
                plans.append(self._texts(request, limits, texts))
            except ContextLengthError as exc:
                plans.append(Failed(exc))
        ids = encode_texts(self.tokenizer, texts)
        out = []
        for plan in plans:
            try:
                out.append(plan if isinstance(plan, Failed) else self._record(plan, ids, limits))
            except ContextLengthError as exc:
                out.append(Failed(exc))
        return out

    def _texts(self, request: DecisionRequest, limits: Limits, texts: list[str]) -> list:
        """The request's pieces of text, appended to texts; → [state index, [(question, instructions index,
        [option index...])...]]. Refuses what cannot fit before tokenizing it."""
        state = render(request.state)
        if _at_least(state, self.per_token) >= limits.state:
            raise ContextLengthError(f"state exceeds {limits.state} tokens: at least "
                                     f"{_at_least(state, self.per_token) + 1}")
        plan = [self._add(texts, state), []]
        state_len = _at_least(state, self.per_token) + 1     # at least, with its STATE token
        for question in request.questions:
            instructions = render(question.instructions)
            if state_len + _at_least(instructions, self.per_token) >= limits.branch:
                raise ContextLengthError(f"branch too long: at least {state_len + _at_least(instructions, self.per_token)}"
                                         f" tokens (limit: {limits.branch})")
            options = native_options(question)
            if self.symbols is not None:
                options = [f"{self.symbols[i]}: {option}" for i, option in enumerate(options)]
            plan[1].append((question, self._add(texts, instructions), [self._add(texts, o) for o in options]))
        return plan

    def _add(self, texts: list[str], text: str) -> int:
        texts.append(self.safe_text(text) if text else "")
        return len(texts) - 1

    def _record(self, plan: list, ids: list[list[int]], limits: Limits) -> Encoded:
        state, questions = plan
        prefix = [self.state_id, *ids[state]]
        if len(prefix) > limits.state:
            raise ContextLengthError(f"state exceeds {limits.state} tokens: {len(prefix)}")
        branches = tuple(self._branch(ids, instr, options, len(prefix), limits) for _, instr, options in questions)
        # JevAny counts the packed encoding as input, whichever layout runs it.
        return Encoded(tuple(prefix), branches, len(prefix) + sum(len(b.tokens) for b in branches))

    def _branch(self, ids: list[list[int]], instructions: int, options: list[int], state_len: int,
                limits: Limits) -> Branch:
        tokens = [self.question_id, *ids[instructions]]
        _check_row(state_len + len(tokens), limits)
        closes = []
        for option in options:
            tokens += [self.open_id, *ids[option], self.close_id]
            closes.append(len(tokens) - 1)
        tokens.append(self.decide_id)
        _check_row(state_len + len(tokens), limits)
        decide = len(tokens) - 1
        readout = (decide, *closes) if self.symbols is None else (decide,)
        return Branch(tuple(tokens), readout)


def _check_row(length: int, limits: Limits) -> None:
    if length > limits.branch:
        raise ContextLengthError(f"branch too long: {length} tokens (limit: {limits.branch})")
    if length > limits.window:
        raise ContextLengthError(f"request exceeds backbone context window of {limits.window} tokens")


class ChoiceEncoder:
    """The training-free choice-token prompt: one chat prompt per question, read at its last token.

    Questions of one request share everything up to where their prompts first
    differ; that common prefix becomes the shared part so the packed layout
    can run it once.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self.specials = sorted(
            (t for t in tokenizer.all_special_tokens if t[:1] in ("<", "[")), key=len, reverse=True
        )
        self.per_token = max_token_chars(tokenizer)
        self.fast = bool(getattr(tokenizer, "is_fast", False))
        # The template rendered and its constant parts tokenized once, where that is exact.
        self.chat_prompt = ChatPrompt.build(tokenizer, self._render) if self.chat and self.fast else None
        # What the prompt adds around the user message, in characters, where that is the same for all.
        self._frame = len(self._render("")) if self.chat_prompt is not None or not self.chat else None

    def safe_text(self, text: str) -> str:
        if "<" not in text and "[" not in text:
            return text        # every special this defuses starts with one of them (see __init__)
        text = escape_named_specials(text)
        for token in self.specials:
            text = text.replace(token, {"<": "\u2039", "[": "\uff3b"}[token[0]] + token[1:])
        return text

    def prompt(self, request: DecisionRequest, question: Question) -> str:
        return self._render(self._user(self._state_text(request), question))

    def _state_text(self, request: DecisionRequest) -> str:
        return self.safe_text(_as_text(request.state, indent=1)).rstrip()

    def _user(self, state: str, question: Question) -> str:
        return "\n".join([
            state,
            "",
            self.safe_text(_as_text(question.instructions)).rstrip(),
            "",
            "Options:",
            *(f"{CHOICE_IDS[i]}. {self.safe_text(d)}" for i, d in enumerate(choice_descriptions(question))),
            "",
            CHOICE_ANSWER_LINE,
        ])

    def _render(self, user: str) -> str:
        if not self.chat:
            return f"{CHOICE_SYSTEM_PROMPT}\n\n{user}\n"
        messages = [{"role": "system", "content": CHOICE_SYSTEM_PROMPT}, {"role": "user", "content": user}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  enable_thinking=False)

    @cached_property
    def head(self) -> tuple[int, ...]:
        """The tokens every prompt starts with, before the state (system prompt and chat header)."""
        ids, within = self._ids([self._user("x", Question("q", "noul", None, None))], [0])[0]
        return tuple(ids[:within])

    def _ids(self, users: list[str], ends: list[int]) -> list[tuple[list[int], int]]:
        """Each user message's prompt ids, and how many of them lie wholly before character ends[i] of
        the message (a token that straddles it is not counted: what follows may merge with it
        differently in another prompt). One batched call on a fast tokenizer."""
        if self.chat_prompt is not None:
            return self.chat_prompt.ids(users, ends)
        texts = [self._render(u) for u in users]
        # The user message ends with the options and the answer line, so it cannot
        # also occur in what the template appends after it.
        starts = [max(0, t.rfind(u)) for t, u in zip(texts, users)]
        if self.fast:
            encodings = self.tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
            return [(e.ids, tokens_before((stop for _, stop in e.offsets), start + end))
                    for e, start, end in zip(encodings, starts, ends)]
        return [self._slow(t, start + end) for t, start, end in zip(texts, starts, ends)]

    def _slow(self, text: str, end: int) -> tuple[list[int], int]:
        """A slow tokenizer has no offsets: the tokens text and text[:end] agree on, but the last."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        before = self.tokenizer(text[:end], add_special_tokens=False)["input_ids"]
        within = 0
        while within < min(len(ids), len(before)) - 1 and ids[within] == before[within]:
            within += 1      # the last token of `before` may straddle, so it never counts
        return ids, within

    def encode(self, request: DecisionRequest, limits: Limits) -> Encoded:
        out = self.encode_many([request], limits)[0]
        if isinstance(out, Failed):
            raise out.error
        return out

    def encode_many(self, requests: list[DecisionRequest], limits: Limits) -> list["Encoded | Failed"]:
        """Every request's prompts, all questions of all requests tokenized in one batched call."""
        limit = min(limits.branch, limits.window, limits.choice or limits.window)
        plans, users, ends = [], [], []     # ends: where each user message's state ends
        for request in requests:
            try:
                self._check_state_size(request.state, limits.state)
                state = self._state_text(request)
                self._check_state(state, limits.state)
                mine = [self._user(state, q) for q in request.questions]
                for user in mine:
                    self._check_chars(user, limit)
                plans.append((len(users), len(mine)))
                users += mine
                ends += [len(state)] * len(mine)
            except ContextLengthError as exc:
                plans.append(Failed(exc))
        encoded = self._ids(users, ends)
        out = []
        for plan in plans:
            try:
                out.append(plan if isinstance(plan, Failed) else self._record(encoded, *plan, limit))
            except ContextLengthError as exc:
                out.append(Failed(exc))
        return out

    def _check_chars(self, user: str, limit: int) -> None:
        """Refuse a prompt whose characters alone prove it too long, before tokenizing it."""
        chars = self._frame + len(user) if self._frame is not None else len(self._render(user))
        n = -(-chars // self.per_token) + 1
        if n > limit:
            raise ContextLengthError(f"the choice readout's prompt needs at least {n} tokens including the "
                                     f"answer; limit {limit}")

    def _record(self, encoded: list, at: int, n: int, limit: int) -> Encoded:
        prompts = [ids for ids, _ in encoded[at:at + n]]
        stem = encoded[at][1]
        for p in prompts:
            # The answer token must fit too, as JevAny counts it.
            if len(p) + 1 > limit:
                raise ContextLengthError(f"the choice readout's prompt needs {len(p) + 1} tokens including the "
                                         f"answer; limit {limit}")
        shared = _common_prefix_length(prompts, stem)
        branches = tuple(Branch(tuple(p[shared:]), (len(p) - shared - 1,)) for p in prompts)
        return Encoded(tuple(prompts[0][:shared]), branches, sum(len(p) for p in prompts), min(stem, shared))

    def _check_state_size(self, state, limit: int) -> None:
        """Refuse a state whose compact JSON alone proves it too long, before rendering it indented.

        The indented text (json's pure-Python encoder, about 2.5 µs a value: 2.5 s
        for 4 MB of small maps) is never shorter than the compact one, which json's
        C encoder writes at tens of megabytes a second."""
        if isinstance(state, str) or state is None:
            return
        n = -(-len(json.dumps(state, ensure_ascii=False)) // self.per_token)
        if n > limit:
            raise ContextLengthError(f"state exceeds {limit} tokens: at least {n}")

    def _check_state(self, state: str, limit: int) -> None:
        """max_state_tokens holds for this prompt too: the state's own tokens, as the user message holds it."""
        if _at_least(state, self.per_token) > limit:
            raise ContextLengthError(f"state exceeds {limit} tokens: at least {_at_least(state, self.per_token)}")
        # A byte-level vocabulary never spends more than a token per byte, so a state
        # whose bytes fit needs no second tokenization.
        if len(state.encode()) + 1 <= limit:
            return
        n = len(encode_texts(self.tokenizer, [state])[0])
        if n > limit:
            raise ContextLengthError(f"state exceeds {limit} tokens: {n}")


def _common_prefix_length(prompts: list[list[int]], hint: int = 0) -> int:
    """How many leading ids all prompts share; hint: a length they likely share (their state's tokens),
    checked with one slice comparison each so only what follows it is walked id by id."""
    # Every branch keeps at least its last token, the one the readout reads.
    limit = min(len(p) for p in prompts) - 1
    if len(prompts) == 1:
        return limit
    first = prompts[0]
    n = min(hint, limit)
    if any(p[:n] != first[:n] for p in prompts):
        n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def _as_text(value, indent=None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=indent, ensure_ascii=False)


def choice_descriptions(question: Question) -> list[str]:
    if question.type == "choice":
        return [_described(key, desc) for key, desc in question.criteria.items()]
    if question.type == "score":
        return [
            f"Level {i}" if _blank(level) else _as_text(level) for i, level in enumerate(question.criteria)
        ]
    criteria = question.criteria or {}
    return [
        "No" if _blank(criteria.get("false")) else _as_text(criteria["false"]),
        "Yes" if _blank(criteria.get("true")) else _as_text(criteria["true"]),
    ]


def _described(key: str, desc) -> str:
    if _blank(desc):
        return key
    if isinstance(desc, str):
        return desc
    return f"{key}: {_as_text(desc)}"


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def make_encoder(model):
    """The prompt style of a DecisionModel's readout."""
    if model.readout == "choice":
        return ChoiceEncoder(model.tokenizer)
    symbols = None
    if model.readout == "lm_token":
        symbols = [model.tokenizer.decode([i]) for i in model.verbalizer_ids]
    return NativeEncoder(model.tokenizer, model.decision_tokens, symbols)
