"""What an engine serves and how, as `models` and `/v1/models` show it.

Two vocabularies in one entry: ours (readout, layout, limits.max_*) and
JevAny's (its runtime's describe(): run, base, capabilities, limits.choices,
acceleration, letter_readout...), so a JevAny tool reads its own fields.
Where a name means something else to JevAny (readout, prefix_cache.size),
the HTTP gateway rewrites it (gateway/jevany_view.py); here it keeps ours.
"""
import torch

from .admission import LATEST_ALIAS, MAX_MEDIA_QUESTIONS
from .layouts import SHARED_PROVEN

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def describe(engine) -> dict:
    m = engine.model
    media_types = list(getattr(m, "media_types", ()))
    choice = m.readout == "choice"
    return {
        "id": m.model_id,
        "aliases": [] if m.model_id == LATEST_ALIAS else [LATEST_ALIAS],
        "source": m.source,
        "readout": m.readout,
        "layout": engine.layout.name,
        "batch_invariant": engine.config.batch_invariant,
        "device": str(m.device),
        "dtype": DTYPE_NAMES.get(m.dtype, str(m.dtype)),
        "cpu_threads": torch.get_num_threads() if m.device.type == "cpu" else None,
        "context_window": m.context_window,
        "linear_attention": m.info.get("linear_attention"),   # which kernels, on hybrid models
        "random_weights": bool(m.info.get("random_weights")),  # the built-in demo model
        "max_options": engine.max_options,
        "media_types": media_types,                            # what media a request may carry
        "choice_readout": _choice(engine),
        "letter_readout": _choice(engine),                     # JevAny's legacy name for the same
        "date_facts": engine.config.date_facts,
        "release_date": m.info.get("release_date"),     # the day its files were written
        # JevAny's description (its runtime.py describe()), under its names where ours differ
        "run": m.source,
        "base": m.info.get("named_base"),
        "lora": m.info.get("lora", 0),
        "devices": [str(d) for d in m.devices],
        "device_map": m.info.get("device_map"),
        "temperature": engine.readout.temperature,
        "decision_mode": m.info.get("decision_mode"),          # a checkpoint's own readout; None: none
        "backbone_adapter": m.info.get("backbone_adapter"),
        "branch_mode": "chat" if choice else engine.layout.name,
        "acceleration": {
            "compile_mode": engine.config.compile, "cuda_graphs": _graphs(engine), "fused_kernels": None,
            "lora_merged": bool(m.info.get("lora_merged")),
            "approximate_bf16_merge": bool(m.info.get("approximate_bf16_merge")),
            "linear_attention_kernels": m.info.get("linear_attention_kernels"),
        },
        "capabilities": {
            "context_window": m.context_window, "prefix_cache": m.model_type in SHARED_PROVEN,
            "media_types": media_types,
            "max_media_questions": MAX_MEDIA_QUESTIONS if media_types else None,
        },
        "limits": {
            "max_state_tokens": engine.limits.state,
            "max_branch_tokens": engine.limits.branch,
            "max_packed_tokens": engine.config.max_packed_tokens,
            "max_batch_size": engine.config.max_batch_size,
            "max_padding_waste": engine.batch_limits.max_padding_waste,
            # JevAny's names; a choice prompt is bounded by the choice limit too
            "state_tokens": engine.limits.state,
            "branch_tokens": min(engine.limits.branch, engine.limits.choice) if choice else engine.limits.branch,
            "packed_tokens": engine.config.max_packed_tokens,
            "choices": None if m.readout == "pointer" else engine.max_options,
        },
        "prefix_cache": engine.prefix_cache_stats(),
        "plan": engine.replay.describe() if engine.replay is not None else None,
        "batching": engine.stats.as_dict() | {"policy": engine.config.batch_policy,
                                              "measured_tokens_per_s": engine.policy.as_dict()},
    }


def _graphs(engine) -> dict | None:
    """JevAny's acceleration.cuda_graphs: the shapes captured and what they took; None when off."""
    if not engine.config.cuda_graphs or engine.replay is None:
        return None
    plan = engine.replay.describe()
    return {"shapes": plan["buckets"], "captured": plan["captured"], "max_tokens": engine.replay.graph_max_tokens,
            "capture_s": plan["warm_up_s"].get("capture", 0.0)}


def _choice(engine) -> dict | None:
    """The choice readout's settings, under JevAny's names (legacy ones too); None for the other readouts."""
    if engine.model.readout != "choice":
        return None
    out = {"temperature": engine.readout.temperature, "native_weight": engine.config.choice_native_weight,
           "pointer_weight": engine.config.choice_native_weight, "max_tokens": engine.config.choice_max_tokens,
           "effective_max_tokens": engine.limits.choice, "backbone_context_window": engine.model.context_window}
    if engine.blend is not None:
        out |= {"native_readout": engine.blend.kind, "native_temperature": engine.blend.temperature,
                "pointer_temperature": engine.blend.temperature}
    return out
