"""What a loaded decision model is: a causal LM, its tokenizer and the readout that reads it.

Loading (loading.py) produces one of these; the engine consumes it. Keeping the
contract in one small dataclass lets tests build models directly and lets the
engine stay ignorant of checkpoint formats.
"""
from dataclasses import dataclass, field, replace

import torch

READOUTS = ("choice", "pointer", "lm_token")

# Per-readout option caps (JevAny facts, section 1).
MAX_OPTIONS = {"pointer": 4096, "lm_token": 255, "choice": 52}


@dataclass
class DecisionModel:
    model_id: str                  # what replies name as "model"
    source: str                    # where it was loaded from (directory or hub id)
    causal_lm: torch.nn.Module     # a transformers *ForCausalLM (multimodal: *ForConditionalGeneration), eval
                                   # mode, on device (or spread: devices)
    tokenizer: object              # a transformers PreTrainedTokenizerFast
    readout: str                   # one of READOUTS
    device: torch.device           # where inputs go: the embedding's device
    dtype: torch.dtype
    # Native JevAny prompts (pointer, lm_token): the five delimiter strings in
    # order state, question, option-open, option-close, decide.
    decision_tokens: tuple[str, ...] | None = None
    head: torch.nn.Module | None = None          # PointerHead for readout "pointer"
    verbalizer_ids: list[int] = field(default_factory=list)  # lm_token symbols, in order
    temperature: float = 1.0
    # A checkpoint with a vision tower (multimodal.py): text requests still run the
    # backbone; media requests run the whole model through the processor. media_types
    # is what this host can encode (empty when the processor's packages are missing).
    multimodal: bool = False
    processor: object | None = None
    media_types: tuple[str, ...] = ()
    info: dict = field(default_factory=dict)     # extra facts for describe() (lora, checkpoint kind...)
    # A model spread over GPUs by a device map: its final hidden states come out
    # on output_device (the final norm's), not on device. None: device.
    output_device: torch.device | None = None
    devices: tuple[torch.device, ...] = ()       # every device holding weights; empty: (device,)
    # A JevAny checkpoint served through the choice readout keeps its own
    # readout (pointer or lm_token: head, verbalizers, delimiters above) and
    # that readout's trained temperature, for the choice readout's native blend.
    native_readout: str | None = None
    native_temperature: float = 1.0

    def __post_init__(self):
        self.output_device = self.output_device or self.device
        self.devices = tuple(self.devices) or (self.device,)

    @property
    def config(self):
        return self.causal_lm.config

    @property
    def backbone(self) -> torch.nn.Module:
        """The decoder stack that returns final (normed) hidden states, without the LM head."""
        return self.causal_lm.get_decoder()

    @property
    def model_type(self) -> str:
        return self._text_config.model_type

    @property
    def _text_config(self):
        cfg = self.config
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    @property
    def layer_types(self) -> tuple[str, ...]:
        """Each decoder layer's kind (full_attention, linear_attention...); empty when the config does not say."""
        return tuple(getattr(self._text_config, "layer_types", None) or ())

    @property
    def hybrid(self) -> bool:
        """True when some layers are not full attention (e.g. Qwen3.5 Gated DeltaNet)."""
        return any(t != "full_attention" for t in self.layer_types)

    @property
    def context_window(self) -> int:
        return int(getattr(self._text_config, "max_position_embeddings", 1 << 30))

    @property
    def max_options(self) -> int:
        return MAX_OPTIONS[self.readout]

    def native(self) -> "DecisionModel":
        """The same weights seen through the checkpoint's own readout (native_readout must be set)."""
        if self.native_readout is None:
            raise ValueError(f"{self.source!r} has no native readout")
        return replace(self, readout=self.native_readout, temperature=self.native_temperature,
                       native_readout=None)
