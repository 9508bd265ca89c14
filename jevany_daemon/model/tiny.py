"""Small random models of real architectures, for tests and smoke deployments.

The weights are random but everything around them is real: a byte-level BPE
tokenizer trained here on a synthetic corpus, a transformers config of the
architecture we serve (qwen3: attention only; qwen3_5: Gated DeltaNet hybrid,
optionally multimodal with its vision tower and processor, tiny_vision.py)
and, for the native readouts, a JevAny-format run directory (LoRA adapter on
the decoder backbone plus head.pt) that loads through the same path as a real
checkpoint. Nothing is downloaded.
"""
from __future__ import annotations

import contextlib
import functools
import random
import warnings
from pathlib import Path

import torch

from jevany_daemon.model.checkpoint import DECISION_TOKENS, HEAD_FILE, verbalizer_table
from jevany_daemon.model.pointer_head import PointerHead
from jevany_daemon.model.quiet import no_progress_bars

ARCHS = ("qwen3", "qwen3_5")
TINY_READOUTS = ("choice", "pointer", "lm_token")

EOS = "<|endoftext|>"
SPECIAL_TOKENS = (EOS, "<|im_start|>", "<|im_end|>", *DECISION_TOKENS)
VOCAB_SIZE = 2000
LORA_RANK = 4
HEAD_DIM = 64
HEAD_RESIDUAL_DIM = 16
TEMPERATURE = {"pointer": 1.0, "lm_token": 1.5}

# Qwen2's pre-tokenizer split: digits one by one, letters in runs, punctuation in runs.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# enable_thinking is accepted (callers pass it for Qwen3 templates) and ignored.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_WORDS = """
the of and to in is it that for on with as was be by at this are from or have an
not but what all were when we there can your which their said if do will each about
how up out them then she many some so these would other into has more her two like
him see time could no make than first been its who now people my made over did down
only way find use may water long little very after words called just where most know
state question questions option options choice choices score level levels noul yes no
true false null none answer answers model request requests prompt token tokens agent
user system assistant engine calibration probability probabilities confidence decide
decision decisions exactly one case sensitive ID nothing else never prose given set
numbered reply single character punctuation explanation instructions instruction
criteria description legend value values key keys name names type types id ids list
player game board move moves turn round win lose draw score price cost buy sell order
item items cart user account balance date day days week month year hour minute today
red green blue black white small large good bad high low left right north south east west
city country street house room door window car road file path error warning status ok
""".split()

_KEYS = ("name", "type", "id", "state", "price", "count", "status", "color", "city",
         "level", "score", "description", "items", "turn", "player", "date", "value")

CHOICE_SYSTEM_PROMPT = (
    "You are a calibration engine. You never answer in prose. You are given a state, "
    "a question and a numbered set of options, and you choose exactly one option. You "
    "reply with that option's case-sensitive ID and nothing else \u2014 a single character, "
    "no words, no punctuation, no explanation."
)
CHOICE_ANSWER_LINE = "Answer with the case-sensitive ID of exactly one option, and nothing else:"


_SYLLABLES = ("ba", "ter", "con", "ing", "ment", "pro", "re", "tion", "al", "ver", "sta", "ble",
              "an", "dis", "ex", "ous", "per", "com", "ly", "mi", "na", "lo", "ri", "ca", "est")


class _Corpus:
    """Deterministic English-like sentences, JSON, key: value blocks and choice prompts."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        invented = {self._invented_word() for _ in range(400)}
        self.words = _WORDS + sorted(invented - set(_WORDS))

    def _invented_word(self) -> str:
        return "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.randint(2, 4)))

    def word(self) -> str:
        return self.rng.choice(self.words)

    def sentence(self) -> str:
        rng = self.rng
        words = [self.word() for _ in range(rng.randint(3, 12))]
        words[0] = words[0].capitalize()
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 10_000)))
        return " ".join(words) + rng.choice(".?!,;:")

    def value(self) -> str:
        rng, roll = self.rng, self.rng.random()
        if roll < 0.3:
            return str(rng.randint(-500, 5000))
        if roll < 0.45:
            return f"{rng.uniform(0, 100):.2f}"
        if roll < 0.6:
            return rng.choice(("true", "false", "null"))
        return '"' + " ".join(self.word() for _ in range(rng.randint(1, 3))) + '"'

    def json_line(self) -> str:
        keys = self.rng.sample(_KEYS, self.rng.randint(1, 4))
        return "{" + ", ".join(f'"{key}": {self.value()}' for key in keys) + "}"

    def key_values(self) -> str:
        lines = []
        for key in self.rng.sample(_KEYS, self.rng.randint(2, 5)):
            value = self.rng.choice((str(self.rng.randint(0, 999)), self.word(), "- " + self.word()))
            lines.append(f"{'  ' * self.rng.randint(0, 2)}{key}: {value}")
        return "\n".join(lines)

    def choice_prompt(self) -> str:
        labels = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
        options = [f"{labels[i]}. {self.word()}" for i in range(self.rng.randint(2, 6))]
        return "\n".join([self.sentence(), "", "Options:", *options, "", CHOICE_ANSWER_LINE])

    def chat_turn(self) -> str:
        return self.rng.choice(("system", "user", "assistant")) + "\n" + self.sentence()

    def lines(self, count: int) -> list[str]:
        makers = (self.sentence, self.sentence, self.json_line, self.key_values, self.choice_prompt,
                  self.chat_turn)
        return [self.rng.choice(makers)() for _ in range(count)]


def _symbol_block() -> str:
    """Every printable character of U+00A1..U+017F, split by digits so each is its own pre-token.

    Repeated often enough that BPE merges each into one token, so lm_token
    checkpoints get a full table of 255 single-token verbalizers.
    """
    chars = [chr(c) for c in range(0xA1, 0x180) if chr(c).isprintable() and not chr(c).isspace()]
    return "".join(f"{ch}{i % 10}" for i, ch in enumerate(chars))


def synthetic_corpus(seed: int = 1234, lines: int = 5000) -> list[str]:
    corpus = _Corpus(seed).lines(lines)
    corpus.extend([CHOICE_SYSTEM_PROMPT] * 50 + [_symbol_block()] * 60)
    return corpus


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(), trainer=trainer)
    return tok.to_str()


def build_tokenizer(multimodal: bool = False):
    """A fresh PreTrainedTokenizerFast with the tiny vocabulary (trained once per process).

    multimodal: the vision tokens are added after the trained vocabulary, so the
    text tokens keep the ids a text model's tokenizer gives them.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from jevany_daemon.model.tiny_vision import VISION_TOKENS

    specials = list(SPECIAL_TOKENS[1:]) + (list(VISION_TOKENS) if multimodal else [])
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        eos_token=EOS,
        pad_token=EOS,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=specials,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


@contextlib.contextmanager
def quiet():
    """No progress bars or deprecation chatter from transformers/peft while writing files."""
    with no_progress_bars(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


# Backbone sizes. "0.8b" is Qwen3.5-0.8B's layer shape (random weights, the
# tiny vocabulary): realistic compute per token for benchmarks on a GPU.
# "tiny8" is the tiny width with the real model's depth pattern (8 layers,
# 3 linear : 1 full), for tests of how values travel between layer types.
# "starter" is the tiny width with one layer: the backbone the starter model
# trains on the spot (jevany_daemon/starter), cheap enough to train in the tests.
# "deep" is the tiny width at the real models' depth (Qwen3-0.6B's 28 layers,
# Qwen3.5-0.8B's 24 in its pattern): what a pass costs the host in dispatch,
# per layer, which decides GPU throughput (benchmarks/host_bench.py). "micro"
# is that depth at width 16, the simulated accelerator's model: a forward that
# is almost nothing but dispatch.
_TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64)
SHAPES = {
    "tiny": _TINY,
    "tiny8": {**_TINY, "num_hidden_layers": 8},
    "starter": {**_TINY, "num_hidden_layers": 1},
    "deep": {**_TINY, "num_hidden_layers": 28},
    "micro": dict(hidden_size=16, intermediate_size=32, num_hidden_layers=28, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8),
    "0.8b": dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=256),
}
_TINY_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                    linear_value_head_dim=32)
LINEAR_SHAPES = {
    "tiny": _TINY_LINEAR,
    "tiny8": _TINY_LINEAR,
    "starter": _TINY_LINEAR,
    "deep": _TINY_LINEAR,
    "micro": dict(linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8,
                  linear_value_head_dim=8),
    "0.8b": dict(linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                 linear_value_head_dim=128),
}
_LINEAR, _FULL = "linear_attention", "full_attention"
# Qwen3.5's layer pattern. The 4-layer tiny model breaks it on purpose: a
# full-attention layer before the last linear one, so whatever an attention
# layer leaves at a padded position (a NaN, on CUDA) can reach real tokens
# through the recurrence in ordinary tests, as it would in the real model.
LAYER_TYPES = {
    "tiny": [_LINEAR, _FULL, _LINEAR, _FULL],
    "tiny8": [_LINEAR] * 3 + [_FULL] + [_LINEAR] * 3 + [_FULL],
    "starter": [_FULL],
    "deep": ([_LINEAR] * 3 + [_FULL]) * 6,
    "micro": ([_LINEAR] * 3 + [_FULL]) * 6,
    "0.8b": ([_LINEAR] * 3 + [_FULL]) * 6,
}


# Positions a model reads: 4,096, but for the starter, which is served to the field's conformance suite as
# it comes: 255 described options of one choice question take it about 7,700 tokens.
WINDOWS = {"starter": 16384}


def _model_config(arch: str, tokenizer, shape: str = "tiny"):
    from transformers import Qwen3_5TextConfig, Qwen3Config

    eos = tokenizer.convert_tokens_to_ids(EOS)
    common = dict(
        # Padded past the tokenizer like real checkpoints, so code must not assume equality.
        vocab_size=-(-len(tokenizer) // 64) * 64,
        **SHAPES[shape],
        max_position_embeddings=WINDOWS.get(shape, 4096),
        eos_token_id=eos,
        pad_token_id=eos,
        bos_token_id=None,
    )
    if arch == "qwen3":
        return Qwen3Config(**common, tie_word_embeddings=True)
    if arch == "qwen3_5":
        # Untied, like the large Qwen3.5 checkpoints: readouts must use the real LM head.
        # Its depth is its layer pattern's (24 in the deep shapes, as Qwen3.5-0.8B).
        common["num_hidden_layers"] = len(LAYER_TYPES[shape])
        return Qwen3_5TextConfig(
            **common,
            tie_word_embeddings=False,
            **LINEAR_SHAPES[shape],
            layer_types=LAYER_TYPES[shape],
        )
    raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")


def build_causal_lm(arch: str, tokenizer, seed: int = 0, shape: str = "tiny"):
    from transformers import AutoModelForCausalLM

    config = _model_config(arch, tokenizer, shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return model.eval()


def build_multimodal_lm(tokenizer, seed: int = 0, shape: str = "tiny"):
    """Qwen3_5ForConditionalGeneration: the qwen3_5 language model of this shape, with a tiny vision tower."""
    from transformers import AutoModelForImageTextToText

    from jevany_daemon.model.tiny_vision import multimodal_config

    config = multimodal_config(_model_config("qwen3_5", tokenizer, shape), tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return model.eval()


def lora_targets(backbone) -> list[str]:
    """Attention projections (and Gated DeltaNet's in/out projections) present in this backbone."""
    wanted = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj")
    present = {name.rsplit(".", 1)[-1] for name, _ in backbone.named_modules()}
    return [w for w in wanted if w in present]


def lora_config(backbone, rank: int = LORA_RANK):
    """JevAny's adapter shape: rank r, alpha 2r (the loader's rule), on every projection lora_targets finds."""
    from peft import LoraConfig

    return LoraConfig(task_type="FEATURE_EXTRACTION", r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                      target_modules=lora_targets(backbone))


def save_adapter(peft_model, out: Path) -> None:
    """The adapter files of a run directory, naming its base model by the run directory's layout."""
    peft_model.peft_config["default"].base_model_name_or_path = "base"
    peft_model.save_pretrained(out, save_embedding_layers=False)
    (out / "README.md").unlink(missing_ok=True)


def _save_random_adapter(causal_lm, out: Path, seed: int) -> None:
    from peft import get_peft_model

    peft_model = get_peft_model(causal_lm.get_decoder(), lora_config(causal_lm.get_decoder()))
    # PEFT starts lora_B at zero (a no-op adapter); a real adapter changes outputs.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    save_adapter(peft_model, out)


def save_run_tokenizer(save_preprocessing, tokenizer, out: Path) -> None:
    """What JevAny records on first preparation: the alphabet, explicitly."""
    tokenizer.init_kwargs["jevany_decision_tokens"] = list(DECISION_TOKENS)
    save_preprocessing(out)


def head_meta(readout: str, tokenizer, head: PointerHead | None = None, *, lora: int = LORA_RANK,
              temperature: float | None = None, multimodal: bool = False, **extra) -> dict:
    """head.pt's metadata for a run directory whose base lies in OUT/base; extra: more keys, kept as they are."""
    residual = head.residual[0].out_features if head is not None and head.residual is not None else 0
    return {
        "base": "base",
        "lora": lora,
        "head_dim": head.head_dim if head is not None else HEAD_DIM,
        "head_residual_dim": residual,
        "decision_mode": readout,
        "verbalizers": verbalizer_table(tokenizer) if readout == "lm_token" else [],
        "temperature": TEMPERATURE[readout] if temperature is None else float(temperature),
        "tokenizer_saved": True,
        "special_embeddings": False,
        "multimodal": multimodal,
        "branch_mode": "auto",
        "weights_dtype": "fp32",
        "head": None if head is None else {k: v.detach().clone() for k, v in head.state_dict().items()},
        "head_type": "residual" if residual else "linear",
        **extra,
    }


def _random_head(hidden_size: int, seed: int) -> PointerHead:
    torch.manual_seed(seed + 2)
    return PointerHead(hidden_size, HEAD_DIM, HEAD_RESIDUAL_DIM)


def build_tiny_model(out: Path | str, arch: str = "qwen3", readout: str = "choice", seed: int = 0,
                     shape: str = "tiny", multimodal: bool = False) -> Path:
    """Write a tiny random model to OUT and return OUT.

    choice: OUT is a plain Hugging Face model directory. pointer / lm_token: OUT
    is a JevAny run directory (tokenizer, LoRA adapter, head.pt) whose base
    model lies in OUT/base. multimodal (qwen3_5 only): the base model is a
    Qwen3_5ForConditionalGeneration with its processor (image and video) saved
    beside it, and head.pt says multimodal.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    if multimodal and arch != "qwen3_5":
        raise ValueError(f"multimodal tiny models are qwen3_5 (with its vision tower), not {arch!r}")
    if readout not in TINY_READOUTS:
        raise ValueError(f"unknown readout {readout!r}; expected one of {TINY_READOUTS}")
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {tuple(SHAPES)}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        # A stale head.pt would silently turn a plain model into a checkpoint.
        raise FileExistsError(f"{out} exists and is not an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    with quiet(), torch.random.fork_rng(devices=[]):
        _write(out, arch, readout, seed, shape, multimodal)
    return out


def _write(out: Path, arch: str, readout: str, seed: int, shape: str, multimodal: bool) -> None:
    tokenizer = build_tokenizer(multimodal)
    if multimodal:
        from jevany_daemon.model.tiny_vision import save_processor

        model = build_multimodal_lm(tokenizer, seed, shape)
        # The processor's files hold the tokenizer's, with the media chat template.
        save_preprocessing = functools.partial(save_processor, tokenizer=tokenizer)
    else:
        model = build_causal_lm(arch, tokenizer, seed, shape)
        save_preprocessing = tokenizer.save_pretrained
    base = out if readout == "choice" else out / "base"
    model.save_pretrained(base)
    save_preprocessing(base)
    if readout == "choice":
        return
    _save_random_adapter(model, out, seed)
    save_run_tokenizer(save_preprocessing, tokenizer, out)
    hidden_size = model.config.get_text_config().hidden_size
    head = _random_head(hidden_size, seed) if readout == "pointer" else None
    torch.save(head_meta(readout, tokenizer, head, multimodal=multimodal), out / HEAD_FILE)
