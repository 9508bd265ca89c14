"""JevAny checkpoint facts: head.pt metadata, decision delimiters and verbalizer symbols."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ModelLoadError(ValueError):
    """A model, checkpoint or tokenizer cannot be loaded or served as asked."""


HEAD_FILE = "head.pt"

# The five delimiters in order: state, question, option-open, option-close, decide.
LEGACY_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|box_start|>", "<|box_end|>", "<|fim_suffix|>")
DECISION_TOKENS = ("<|jev_state|>", "<|jev_question|>", "<|jev_option|>", "<|jev_end_option|>", "<|jev_decide|>")
UNUSED_TOKENS = tuple(f"<unused{i}>" for i in range(5))
RESERVED_TOKENS = tuple(f"<|reserved_special_token_{i}|>" for i in range(2, 7))
ALPHABETS = (LEGACY_TOKENS, DECISION_TOKENS, UNUSED_TOKENS, RESERVED_TOKENS)
SCHEMAS = {"legacy": LEGACY_TOKENS, "v1": DECISION_TOKENS}

MAX_VERBALIZERS = 255


@dataclass
class Meta:
    """The metadata JevAny saves in head.pt, with its defaults."""

    base: str
    head: dict | None = None
    base_revision: str | None = None
    lora: int = 0
    head_dim: int = 256
    head_residual_dim: int = 0
    head_type: str | None = None          # derived from head_residual_dim when absent
    option_isolation: bool = False
    special_embeddings: bool = False
    multimodal: bool = False
    tokenizer_saved: bool = False
    backbone_adapter: str = "auto"
    branch_mode: str = "auto"
    weights_dtype: str = "fp32"
    decision_mode: str = "pointer"
    verbalizers: list[str] = field(default_factory=list)
    temperature: float = 1.0
    holdout: list = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.head_type is None:
            self.head_type = "residual" if self.head_residual_dim > 0 else "linear"

    @classmethod
    def from_dict(cls, data: dict) -> "Meta":
        if not isinstance(data, dict):
            raise ModelLoadError(f"{HEAD_FILE} must hold a dict, not {type(data).__name__}")
        if not data.get("base"):
            raise ModelLoadError(f"{HEAD_FILE} names no base model ('base' is missing)")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        fields = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**fields, extra=extra)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.update(data.pop("extra"))
        return data


def read_meta(run_dir: str | Path) -> Meta:
    import torch

    path = Path(run_dir) / HEAD_FILE
    if not path.is_file():
        raise ModelLoadError(f"not a JevAny checkpoint: {path} does not exist")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    return Meta.from_dict(data)


def _fits(tokenizer, vocab: dict, tokens) -> bool:
    """True when every token is one known, non-unk vocabulary entry and their ids are distinct."""
    unk = getattr(tokenizer, "unk_token_id", None)
    ids = [vocab.get(t) for t in tokens]
    return None not in ids and unk not in ids and len(set(ids)) == len(ids)


def resolve_decision_tokens(tokenizer) -> tuple[str, ...]:
    """The five native delimiters of this tokenizer, by JevAny's resolution order.

    Inference never adds tokens: a tokenizer with no usable alphabet is refused.
    """
    kwargs = getattr(tokenizer, "init_kwargs", None) or {}
    vocab = tokenizer.get_vocab()
    explicit = kwargs.get("jevany_decision_tokens")
    if explicit is not None:
        tokens = tuple(explicit) if isinstance(explicit, (list, tuple)) else ()
        if len(tokens) != 5 or len(set(tokens)) != 5 or not all(isinstance(t, str) for t in tokens):
            raise ModelLoadError(f"jevany_decision_tokens must list 5 distinct strings, got {explicit!r}")
        if not _fits(tokenizer, vocab, tokens):
            raise ModelLoadError(f"jevany_decision_tokens {list(tokens)} are not all distinct tokens of the tokenizer")
        return tokens
    schema = kwargs.get("jevany_token_schema")
    if schema is not None:
        if schema not in SCHEMAS:
            raise ModelLoadError(f"unknown jevany_token_schema {schema!r}; expected one of {sorted(SCHEMAS)}")
        if not _fits(tokenizer, vocab, SCHEMAS[schema]):
            raise ModelLoadError(f"jevany_token_schema {schema!r} names tokens this tokenizer lacks")
        return SCHEMAS[schema]
    for alphabet in ALPHABETS:
        if _fits(tokenizer, vocab, alphabet):
            return alphabet
    raise ModelLoadError(
        "the tokenizer has no JevAny decision tokens (none of the legacy, v1, <unusedN> or "
        "reserved-special alphabets exist as distinct tokens); inference never adds tokens, "
        "so load the tokenizer saved with the checkpoint"
    )


def _candidate_symbols():
    yield from "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    for code in range(0xA1, 0xA000):
        ch = chr(code)
        if ch.isprintable() and not ch.isspace() and ch not in "\"\\":
            yield ch


def verbalizer_table(tokenizer, limit: int = MAX_VERBALIZERS) -> list[str]:
    """JevAny's lm_token symbols: single tokens that decode to themselves, ids unused so far."""
    symbols, used = [], set()
    for ch in _candidate_symbols():
        ids = tokenizer.encode(ch, add_special_tokens=False)
        if len(ids) == 1 and ids[0] not in used and tokenizer.decode(ids) == ch:
            symbols.append(ch)
            used.add(ids[0])
            if len(symbols) == limit:
                break
    return symbols
