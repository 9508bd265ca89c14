import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from jevany_daemon.model.checkpoint import (
    DECISION_TOKENS,
    LEGACY_TOKENS,
    RESERVED_TOKENS,
    UNUSED_TOKENS,
    Meta,
    ModelLoadError,
    read_meta,
    resolve_decision_tokens,
    verbalizer_table,
)


def small_tokenizer(*alphabets, **init_kwargs):
    """A word-level tokenizer knowing a few words plus the given delimiter alphabets."""
    words = ["[UNK]", "a", "b"] + [t for alphabet in alphabets for t in alphabet]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", **init_kwargs)


class FakeTokenizer:
    def __init__(self, vocab, unk_token_id=None):
        self.vocab, self.unk_token_id, self.init_kwargs = vocab, unk_token_id, {}

    def get_vocab(self):
        return dict(self.vocab)


# -- resolve_decision_tokens -----------------------------------------------------------------

def test_explicit_list_wins():
    custom = ["a", "b", "<unused0>", "<unused1>", "<unused2>"]
    tok = small_tokenizer(LEGACY_TOKENS, UNUSED_TOKENS, jevany_decision_tokens=custom)
    assert resolve_decision_tokens(tok) == tuple(custom)


@pytest.mark.parametrize("bad", [["a", "b"], ["a", "a", "b", "<unused0>", "<unused1>"], "abcde"])
def test_explicit_list_must_be_five_distinct_strings(bad):
    tok = small_tokenizer(UNUSED_TOKENS, jevany_decision_tokens=bad)
    with pytest.raises(ModelLoadError, match="5 distinct"):
        resolve_decision_tokens(tok)


def test_explicit_list_must_name_known_tokens():
    tok = small_tokenizer(jevany_decision_tokens=list(DECISION_TOKENS))
    with pytest.raises(ModelLoadError, match="not all distinct tokens"):
        resolve_decision_tokens(tok)


@pytest.mark.parametrize("schema, expected", [("legacy", LEGACY_TOKENS), ("v1", DECISION_TOKENS)])
def test_schema_picks_its_alphabet(schema, expected):
    tok = small_tokenizer(LEGACY_TOKENS, DECISION_TOKENS, jevany_token_schema=schema)
    assert resolve_decision_tokens(tok) == expected


def test_unknown_schema_is_refused():
    with pytest.raises(ModelLoadError, match="jevany_token_schema"):
        resolve_decision_tokens(small_tokenizer(DECISION_TOKENS, jevany_token_schema="v9"))


def test_schema_naming_missing_tokens_is_refused():
    with pytest.raises(ModelLoadError, match="lacks"):
        resolve_decision_tokens(small_tokenizer(DECISION_TOKENS, jevany_token_schema="legacy"))


@pytest.mark.parametrize("alphabets, expected", [
    ((LEGACY_TOKENS, DECISION_TOKENS, UNUSED_TOKENS), LEGACY_TOKENS),
    ((DECISION_TOKENS, UNUSED_TOKENS, RESERVED_TOKENS), DECISION_TOKENS),
    ((UNUSED_TOKENS, RESERVED_TOKENS), UNUSED_TOKENS),
    ((RESERVED_TOKENS,), RESERVED_TOKENS),
    ((LEGACY_TOKENS[:4], RESERVED_TOKENS), RESERVED_TOKENS),  # an incomplete alphabet is skipped
])
def test_first_complete_alphabet_is_found(alphabets, expected):
    assert resolve_decision_tokens(small_tokenizer(*alphabets)) == expected


def test_alphabet_with_shared_or_unk_ids_is_skipped():
    vocab = {t: i for i, t in enumerate(LEGACY_TOKENS)}
    vocab[LEGACY_TOKENS[4]] = 0  # two delimiters share one id
    vocab.update({t: 10 + i for i, t in enumerate(DECISION_TOKENS)})
    vocab[DECISION_TOKENS[2]] = 99  # the unk id
    vocab.update({t: 20 + i for i, t in enumerate(UNUSED_TOKENS)})
    assert resolve_decision_tokens(FakeTokenizer(vocab, unk_token_id=99)) == UNUSED_TOKENS


def test_no_alphabet_is_an_error_not_an_addition():
    tok = small_tokenizer()
    before = len(tok)
    with pytest.raises(ModelLoadError, match="never adds tokens"):
        resolve_decision_tokens(tok)
    assert len(tok) == before


# -- Meta / head.pt --------------------------------------------------------------------------

def test_meta_defaults_and_extra_keys():
    meta = Meta.from_dict({"base": "Qwen/Qwen3-8B", "args": {"lr": 1e-4}, "optimizer_step": 7})
    assert (meta.lora, meta.head_dim, meta.head_residual_dim, meta.head_type) == (0, 256, 0, "linear")
    assert (meta.decision_mode, meta.temperature, meta.branch_mode, meta.weights_dtype) == (
        "pointer", 1.0, "auto", "fp32")
    assert meta.tokenizer_saved is False and meta.verbalizers == [] and meta.holdout == []
    assert meta.extra == {"args": {"lr": 1e-4}, "optimizer_step": 7}
    assert Meta.from_dict({"base": "x", "head_residual_dim": 8}).head_type == "residual"
    assert Meta.from_dict(meta.to_dict()) == meta


def test_meta_requires_a_base():
    with pytest.raises(ModelLoadError, match="base"):
        Meta.from_dict({"lora": 4})
    with pytest.raises(ModelLoadError, match="dict"):
        Meta.from_dict([1, 2])


def test_read_meta_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="head.pt does not exist"):
        read_meta(tmp_path)
    (tmp_path / "head.pt").write_bytes(b"not a torch file")
    with pytest.raises(ModelLoadError, match="cannot read"):
        read_meta(tmp_path)


def test_read_meta_refuses_pickled_objects(tmp_path):
    torch.save({"base": "b", "evil": object()}, tmp_path / "head.pt")
    with pytest.raises(ModelLoadError, match="cannot read"):
        read_meta(tmp_path)


def test_read_meta_round_trip(tmp_path):
    head = {"q.weight": torch.ones(2, 3)}
    torch.save({"base": "base", "lora": 4, "head": head, "suite": "abc"}, tmp_path / "head.pt")
    meta = read_meta(tmp_path)
    assert meta.lora == 4 and torch.equal(meta.head["q.weight"], head["q.weight"])
    assert meta.extra == {"suite": "abc"}


# -- verbalizers -----------------------------------------------------------------------------

def test_verbalizers_keep_only_single_self_decoding_tokens():
    symbols = list("AB") + ["\u00e9", "\u00a7"]
    tok = small_tokenizer(symbols)
    # Word-level: only symbols in the vocabulary are single tokens; others are [UNK].
    assert verbalizer_table(tok) == ["A", "B", "a", "b", "\u00a7", "\u00e9"]
    assert verbalizer_table(tok, limit=2) == ["A", "B"]
