"""A JevAny checkpoint's LoRA adapter on the decoder: applied, scaled, then merged or kept apart.

JevAny's rules (its checkpoint.py): rank from head.pt, alpha twice the rank, the
rest from adapter_config.json; the update scaled by JEVANY_LORA_SCALE; merged
into the base weights in FP32, before any cast, except where JevAny keeps it
apart: JEVANY_MERGE=0, a direct-token (lm_token) checkpoint or one whose adapter
trains token embeddings, and a checkpoint trained on a BF16 backbone unless
JEVANY_MERGE_BF16=1. A kept-apart adapter stays in FP32 beside cast base
weights, as PEFT keeps it.

Served in FP32, a merge is exact (JevAny's words), so there the daemon merges
every checkpoint unless JEVANY_MERGE=0 says not to: the same answers, and fewer
operations a pass than an adapter run beside every projection.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from jevany_daemon.config import LoadOptions
from jevany_daemon.model.checkpoint import HEAD_FILE, Meta, ModelLoadError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_PARAMETERS = "lora_"      # in the names of an adapter's own parameters


def adapter_config(run_dir: Path) -> dict:
    path = run_dir / ADAPTER_CONFIG
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc


def merges(meta: Meta, saved: dict, options: LoadOptions, dtype: torch.dtype) -> bool:
    """Whether the adapter is folded into the base weights (see the module's docstring)."""
    if meta.lora <= 0 or not options.merge:
        return False
    if dtype == torch.float32:
        return True
    kept_apart = meta.decision_mode == "lm_token" or bool(saved.get("trainable_token_indices"))
    return not kept_apart and (meta.weights_dtype != "bf16" or options.merge_bf16)


def apply_adapter(causal_lm, run_dir: Path, meta: Meta, source: str, scale: float, merge: bool) -> None:
    """The LoRA on the decoder backbone (what JevAny trains), its update times scale, merged in place or kept."""
    from peft import get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = run_dir / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ModelLoadError(f"{source!r}: {HEAD_FILE} says lora={meta.lora} but {weights} is missing")
    backbone = causal_lm.get_decoder()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            # get_peft_model puts the LoRA layers into backbone itself; the wrapper is not kept.
            peft_model = get_peft_model(backbone, _lora_config(run_dir, meta))
        result = set_peft_model_state_dict(peft_model, load_file(weights))
        missing = [k for k in result.missing_keys if ADAPTER_PARAMETERS in k]
        if result.unexpected_keys or missing:
            raise ModelLoadError(
                f"adapter does not match the base model: unexpected {result.unexpected_keys[:5]}, "
                f"missing {missing[:5]}"
            )
        _scale(backbone, scale)
        merged = peft_model.merge_and_unload() if merge else backbone
    except ModelLoadError as exc:
        raise ModelLoadError(f"{source!r}: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(f"{source!r}: cannot apply the LoRA adapter: {exc}") from exc
    if merged is not backbone:
        causal_lm.set_decoder(merged)


def _scale(backbone, scale: float) -> None:
    # WiSE-FT-style interpolation, as JevAny does it: every LoRA layer's scaling times scale.
    if scale == 1:
        return
    for module in backbone.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict):
            for name in scaling:
                scaling[name] *= scale


def _lora_config(run_dir: Path, meta: Meta):
    """JevAny's rule: rank from head.pt, alpha = 2 x rank, the rest from adapter_config.json."""
    from peft import LoraConfig

    saved = adapter_config(run_dir)
    targets = saved.get("target_modules")
    if isinstance(targets, list):
        targets = sorted(targets)
    return LoraConfig(
        task_type="FEATURE_EXTRACTION",
        r=meta.lora,
        lora_alpha=2 * meta.lora,
        lora_dropout=float(saved.get("lora_dropout") or 0.0),
        target_modules=targets,
        bias=saved.get("bias", "none"),
        use_rslora=bool(saved.get("use_rslora", False)),
        use_dora=bool(saved.get("use_dora", False)),
        trainable_token_indices=saved.get("trainable_token_indices"),
    )
