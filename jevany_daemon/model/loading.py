"""Load a decision model: a JevAny checkpoint (LoRA + head.pt) or a plain causal LM.

A multimodal one (a plain Qwen3.5 directory with its vision tower, when media
is asked for, or a checkpoint whose head.pt says multimodal) loads whole, as
the conditional-generation model, with its processor (multimodal.py).

Everything that can be checked without weights (readout, device, dtype) is
checked first, so a bad setting fails in milliseconds rather than after a
multi-gigabyte load. Every failure is a ModelLoadError naming the source.
"""
from __future__ import annotations

import datetime
import logging
import re
import time
from pathlib import Path

import torch

from jevany_daemon.config import LoadOptions
from jevany_daemon.model import kernels, multimodal
from jevany_daemon.model.adapter import ADAPTER_PARAMETERS, adapter_config, apply_adapter, merges
from jevany_daemon.model.checkpoint import HEAD_FILE, Meta, ModelLoadError, read_meta, resolve_decision_tokens
from jevany_daemon.model.decision_model import READOUTS, DecisionModel
from jevany_daemon.model.placement import Placement, plan as plan_placement
from jevany_daemon.model.pointer_head import PointerHead
from jevany_daemon.model.quiet import no_progress_bars
from jevany_daemon.model.sources import is_hub_id, split_revision
from jevany_daemon.logs import event

__all__ = ["ModelLoadError", "default_model_id", "load_model", "parse_device", "parse_dtype"]

log = logging.getLogger("jevany.model")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_LABELS = {v: k for k, v in DTYPES.items()}
ATTN_IMPLEMENTATION = "sdpa"

_SPECIAL_IDS = {
    "simplejev/jevany-qwen3.8-27b-lora": "jevany-qwen3.8-27b-lora",
    "tianxinwei/jevany-27b-sft": "jevany-27b",
    "tianxinwei/jevany-27b-rlcr": "jevany-27b",
}


def default_model_id(source: str) -> str:
    """What replies name as "model" when the operator did not choose an id."""
    path = split_revision(str(source).rstrip("/\\"))[0].rstrip("/\\")
    parts = re.split(r"[/\\]", path)
    if parts[-1] in ("", ".", ".."):
        return Path(path or "/").resolve().name or "model"
    return _SPECIAL_IDS.get("/".join(parts[-2:]).lower(), parts[-1])


def _valid_temperature(value) -> bool:
    return isinstance(value, (int, float)) and 0 < value < float("inf")


def parse_dtype(dtype: str | None) -> torch.dtype | None:
    """None stays None: the checkpoint's own (BF16 for one trained on a BF16 backbone, else FP32)."""
    if dtype is None:
        return None
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def parse_device(device: str) -> torch.device:
    """cpu, cuda or cuda:N, checked against the CUDA devices this process can see."""
    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", device)
    if not match:
        raise ModelLoadError(f"unknown device {device!r}; expected cpu, cuda or cuda:N")
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available to this process")
    count = torch.cuda.device_count()
    index = int(match.group(1)) if match.group(1) is not None else torch.cuda.current_device()
    if index >= count:
        raise ModelLoadError(f"device {device!r} requested but only {count} CUDA device(s) are visible")
    return torch.device("cuda", index)


def _written_on(location) -> str | None:
    """The day (UTC, ISO) a model's files were written (for a hub snapshot, downloaded): the release date
    the field's /v1/models gives each model; None where there are no files here (a hub id loaded by name)."""
    directory = Path(location)
    dates = [f.stat().st_mtime for name in (HEAD_FILE, "config.json") if (f := directory / name).is_file()]
    if not dates:
        return None
    return datetime.datetime.fromtimestamp(max(dates), datetime.timezone.utc).date().isoformat()


def load_model(
    source: str,
    readout: str | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    model_id: str | None = None,
    temperature: float | None = None,
    device_map: str | None = None,
    max_memory_gib: float | None = None,
    media: bool = False,
    options: LoadOptions | None = None,
) -> DecisionModel:
    """Load SOURCE (a local directory or an owner/name[@rev] hub id) as a DecisionModel.

    media: load a plain multimodal directory (Qwen3.5 ships its vision tower) whole, with its
    processor, to serve media; without it only the language model loads, as for text alone,
    and the vision tower costs no memory. A checkpoint whose head.pt says multimodal always
    loads whole.

    With device_map (config.DEVICE_MAPS), Accelerate spreads the model over the GPUs in device
    (cuda: every visible one), each taking at most max_memory_gib.

    readout "native" is JevAny's name for a checkpoint's own readout (pointer or lm_token). dtype
    None: the checkpoint's (JevAny's rule: BF16 for one trained on a BF16 backbone, else FP32).
    options: JevAny's load options (LoRA scale and merge, base mirror); None reads its variables.
    """
    source = str(source)
    if not source.strip():
        raise ModelLoadError("no model source given")
    if readout is not None and readout not in (*READOUTS, "native"):
        raise ModelLoadError(f"unknown readout {readout!r}; expected native or one of {', '.join(READOUTS)}")
    try:
        options = LoadOptions.from_env() if options is None else options
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    if temperature is not None and not _valid_temperature(temperature):
        raise ModelLoadError(f"temperature must be a positive finite number, got {temperature!r}")
    torch_dtype = parse_dtype(dtype)
    placement = (plan_placement(device, device_map, max_memory_gib) if device_map is not None
                 else Placement(parse_device(device)))
    kind, location, revision = _locate(source)
    common = dict(source=source, model_id=model_id or default_model_id(source), placement=placement,
                  dtype=torch_dtype, temperature=temperature)
    started = time.monotonic()
    with no_progress_bars():
        if kind == "checkpoint":
            model = _load_checkpoint(Path(location), None if readout == "native" else readout, options=options,
                                     **common)
        else:
            if readout == "native":
                raise ModelLoadError(f"{source!r} is a plain causal LM (no {HEAD_FILE}), so it has no native "
                                     "readout; serve it with the choice readout")
            model = _load_causal_lm(location, revision, readout, media=media, **common)
    paths = kernels.prepare(model.causal_lm, model.dtype, model.device)
    model.info["linear_attention"] = kernels.describe(paths)
    model.info["linear_attention_kernels"] = _kernel_packages(paths)
    model.info["device_map"] = device_map
    model.info["release_date"] = _written_on(location)
    for d in model.devices:
        kernels.no_cudnn_attention(d)
        if model.dtype == torch.float32:
            kernels.strict_fp32(d)
    # The daemon's log is one key=value record per line (logs.py), so this line is one too.
    event(log, "model_loaded", source=source, kind=kind, readout=model.readout,
          devices=",".join(map(str, model.devices)), dtype=DTYPE_LABELS.get(model.dtype, model.dtype),
          seconds=round(time.monotonic() - started, 2))
    return model


def _kernel_packages(paths: dict[str, str] | None) -> dict[str, bool] | None:
    """JevAny's report of the linear-attention fast path: whether each package serves; None without such layers."""
    if paths is None:
        return None
    fast = {name for name, serving in paths.items() if serving != kernels.TORCH}
    return {"flash_linear_attention": bool(fast & set(kernels.DELTA_RULES)),
            "causal_conv1d": bool(fast & set(kernels.CONVOLUTIONS))}


# -- where the weights are -------------------------------------------------------------------

def _locate(source: str) -> tuple[str, str, str | None]:
    """('checkpoint' | 'causal-lm', local dir or hub repo, revision)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return ("checkpoint" if (path / HEAD_FILE).is_file() else "causal-lm"), str(path), None
    if path.exists():
        raise ModelLoadError(f"model source is not a directory: {source}")
    if not is_hub_id(source):
        raise ModelLoadError(f"model does not exist: {source}")
    repo, revision = split_revision(source)
    snapshot = _hub_checkpoint(repo, revision)
    if snapshot is not None:
        return "checkpoint", snapshot, None
    return "causal-lm", repo, revision


def _hub_checkpoint(repo: str, revision: str | None) -> str | None:
    """The local snapshot of a hub JevAny checkpoint, or None when the repo has no head.pt.

    When the hub cannot be asked (offline, not cached) we cannot tell either,
    so the plain causal-LM path gets its chance and reports the failure.
    """
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        hf_hub_download(repo, HEAD_FILE, revision=revision)
    except EntryNotFoundError:  # includes LocalEntryNotFoundError: offline and not cached
        return None
    except Exception as exc:
        raise ModelLoadError(f"cannot load {repo!r} from the Hugging Face hub: {exc}") from exc
    try:
        return snapshot_download(repo, revision=revision)
    except Exception as exc:
        raise ModelLoadError(f"cannot download checkpoint {repo!r} from the Hugging Face hub: {exc}") from exc


def _resolve_base(meta: Meta, run_dir: Path, mirror: str | None) -> tuple[str, str | None]:
    """(directory or hub id, revision) of the checkpoint's base model; a mirror replaces it."""
    if mirror:
        if not Path(mirror).expanduser().is_dir():
            raise ModelLoadError(f"JEVANY_BASE_LOAD_PATH is not a directory: {mirror}")
        return str(Path(mirror).expanduser()), None
    for candidate in (run_dir / meta.base, Path(meta.base).expanduser()):
        if candidate.is_dir():
            return str(candidate), None
    return meta.base, meta.base_revision


# -- loading ---------------------------------------------------------------------------------

def _from_pretrained(what: str, source: str, loader, location: str, **kwargs):
    try:
        return loader(location, **kwargs)
    except Exception as exc:
        where = "" if location == source else f" from {location!r}"
        hint = "" if Path(location).is_dir() else " (not a local directory; tried the Hugging Face hub)"
        raise ModelLoadError(f"cannot load {what} for {source!r}{where}{hint}: {exc}") from exc


def _tokenizer(source: str, location: str, revision: str | None = None):
    from transformers import AutoTokenizer

    return _from_pretrained("the tokenizer", source, AutoTokenizer.from_pretrained, location, revision=revision)


def _causal_lm(source: str, location: str, dtype: torch.dtype, revision: str | None = None,
               placement: Placement | None = None, with_vision: bool = False):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if with_vision else AutoModelForCausalLM
    return _from_pretrained(
        "the model", source, auto.from_pretrained, location,
        revision=revision, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION,
        **(placement.from_pretrained_kwargs() if placement else {}),
    )


def _is_multimodal(source: str, location: str, revision: str | None = None) -> bool:
    from transformers import AutoConfig

    config = _from_pretrained("the model config", source, AutoConfig.from_pretrained, location, revision=revision)
    return multimodal.is_multimodal_config(config)


def _media(source: str, location: str, tokenizer, revision: str | None = None) -> tuple[dict, dict]:
    """(DecisionModel fields, info) for a multimodal model: its processor and the media types it serves.

    A host without the processor's packages (Pillow, torchvision, PyAV) still
    serves text; info says why media are not served.
    """
    try:
        processor = _from_pretrained("the processor", source, multimodal.load_processor, location,
                                     tokenizer=tokenizer, revision=revision)
    except ModelLoadError as exc:
        if not isinstance(exc.__cause__, ImportError):
            raise
        return ({"multimodal": True, "processor": None, "media_types": ()},
                {"multimodal": True, "media_types": [], "media_unavailable": str(exc.__cause__)})
    types = multimodal.media_types(processor)
    info = {"multimodal": True, "media_types": list(types)}
    reasons = [r for r in (multimodal.unavailable(processor, t) for t in multimodal.MEDIA_TYPES) if r]
    if reasons:
        info["media_unavailable"] = "; ".join(reasons)
    return {"multimodal": True, "processor": processor, "media_types": types}, info


def _freeze(module: torch.nn.Module, device: torch.device | None) -> torch.nn.Module:
    if device is not None:     # None: a device map placed it, and moving it would undo that
        module = module.to(device)
    module.eval()
    for param in module.parameters():
        param.requires_grad_(False)
    return module


def _cast_parameters(causal_lm, dtype: torch.dtype) -> None:
    """Cast as from_pretrained(dtype=...) does: parameters only, so fp32 buffers such as the
    RoPE inv_freq stay exact, and modules the model keeps in fp32 stay fp32. So does an
    adapter kept apart from the weights, as PEFT keeps it."""
    keep = set(getattr(causal_lm, "_keep_in_fp32_modules_strict", None) or ()) | {ADAPTER_PARAMETERS}
    if dtype == torch.float16:
        keep |= set(getattr(causal_lm, "_keep_in_fp32_modules", None) or ())
    pattern = re.compile("|".join(re.escape(k) for k in sorted(keep))) if keep else None
    for name, param in causal_lm.named_parameters():
        if param.is_floating_point() and not (pattern and pattern.search(name)):
            param.data = param.data.to(dtype)


def _attn_implementation(causal_lm) -> str | None:
    return getattr(causal_lm.config, "_attn_implementation", None)


def _load_causal_lm(location, revision, readout, *, source, model_id, placement, dtype, temperature, media):
    if readout not in (None, "choice"):
        raise ModelLoadError(
            f"{source!r} is a plain causal LM (no {HEAD_FILE}); it supports only the choice readout, "
            f"not {readout!r}"
        )
    dtype = dtype or torch.float32
    tokenizer = _tokenizer(source, location, revision)
    with_vision = media and _is_multimodal(source, location, revision)
    media, media_info = _media(source, location, tokenizer, revision) if with_vision else ({}, {})
    causal_lm = _causal_lm(source, location, dtype, revision, placement, with_vision)
    causal_lm = _freeze(causal_lm, placement.move_to)
    return DecisionModel(
        model_id=model_id, source=source, causal_lm=causal_lm, tokenizer=tokenizer, readout="choice",
        **placement.settle(causal_lm, source), dtype=dtype,
        temperature=1.0 if temperature is None else float(temperature), **media,
        info={"kind": "causal-lm", "base": location, "revision": revision, "named_base": source,
              "backbone_adapter": _adapter_name("auto", with_vision), "lora": 0, "lora_merged": False,
              "approximate_bf16_merge": False,
              "attn_implementation": _attn_implementation(causal_lm), **media_info},
    )


def _adapter_name(named: str, multimodal: bool) -> str:
    """JevAny's name for the backbone adapter: head.pt's, else the one auto picks (text, or qwen_vl)."""
    if named != "auto":
        return named
    return "qwen_vl" if multimodal else "text"


def _load_checkpoint(run_dir: Path, readout, *, source, model_id, placement, dtype, temperature, options):
    meta = read_meta(run_dir)
    _check_meta(meta, readout, temperature, source)
    base, base_revision = _resolve_base(meta, run_dir, options.base_load_path)
    # JevAny serves a checkpoint trained on a BF16 backbone in BF16; a dtype asked for wins here.
    dtype = dtype or (torch.bfloat16 if meta.weights_dtype == "bf16" else torch.float32)
    if meta.tokenizer_saved:
        tokenizer = _tokenizer(source, str(run_dir))
    else:
        tokenizer = _tokenizer(source, base, base_revision)
    decision_tokens = resolve_decision_tokens(tokenizer)
    verbalizer_ids = _verbalizer_ids(meta, tokenizer) if meta.decision_mode == "lm_token" else []
    media, media_info = {}, {}
    if meta.multimodal:
        if not _is_multimodal(source, base, base_revision):
            raise ModelLoadError(f"{source!r}: {HEAD_FILE} says multimodal, but its base model {base!r} has no "
                                 f"vision tower of a supported family ({', '.join(multimodal.MULTIMODAL_MODEL_TYPES)})")
        # The processor saved with the checkpoint, else the base's; either way around the checkpoint's tokenizer.
        processor_dir, processor_revision = (str(run_dir), None) if multimodal.has_processor(run_dir) \
            else (base, base_revision)
        media, media_info = _media(source, processor_dir, tokenizer, processor_revision)
    causal_lm = _causal_lm(source, base, torch.float32, base_revision, placement, meta.multimodal)
    if len(tokenizer) > causal_lm.get_input_embeddings().num_embeddings:
        # Tokens JevAny added in training; their trained rows come with the adapter.
        causal_lm.resize_token_embeddings(len(tokenizer))
    merged = meta.lora > 0 and merges(meta, adapter_config(run_dir), options, dtype)
    if meta.lora > 0:
        apply_adapter(causal_lm, run_dir, meta, source, options.lora_scale, merged)
    if dtype != torch.float32:
        _cast_parameters(causal_lm, dtype)
    causal_lm = _freeze(causal_lm, placement.move_to)
    where = placement.settle(causal_lm, source)
    # The head reads the final hidden states, so it lives where they come out.
    head = None
    if meta.decision_mode == "pointer":
        head = _pointer_head(meta, causal_lm, where["output_device"], source)
    if readout == "choice":
        # The checkpoint keeps its own readout beside the choice readout (the native
        # blend), and the trained temperature belongs to that one.
        readouts = dict(readout="choice", temperature=1.0 if temperature is None else float(temperature),
                        native_readout=meta.decision_mode, native_temperature=float(meta.temperature))
    else:
        readouts = dict(readout=meta.decision_mode,
                        temperature=float(meta.temperature if temperature is None else temperature))
    return DecisionModel(
        model_id=model_id, source=source, causal_lm=causal_lm, tokenizer=tokenizer,
        **readouts, **where, dtype=dtype, decision_tokens=decision_tokens,
        head=head, verbalizer_ids=verbalizer_ids, **media,
        info={
            "kind": "jevany-checkpoint", "base": base, "base_revision": base_revision, "lora": meta.lora,
            "named_base": meta.base, "backbone_adapter": _adapter_name(meta.backbone_adapter, meta.multimodal),
            "lora_scale": options.lora_scale, "lora_merged": merged,
            "approximate_bf16_merge": merged and meta.weights_dtype == "bf16" and dtype != torch.float32,
            "decision_mode": meta.decision_mode,    # its own readout, whichever one serves
            "head_type": meta.head_type if meta.decision_mode == "pointer" else None,
            "branch_mode": meta.branch_mode, "option_isolation": meta.option_isolation,
            "weights_dtype": meta.weights_dtype, "verbalizers": len(verbalizer_ids),
            "attn_implementation": _attn_implementation(causal_lm), **media_info,
        },
    )


def _check_meta(meta: Meta, readout: str | None, temperature: float | None, source: str) -> None:
    if meta.decision_mode not in ("pointer", "lm_token"):
        raise ModelLoadError(f"{source!r}: unknown decision_mode {meta.decision_mode!r} in {HEAD_FILE}")
    if readout not in (None, "choice", meta.decision_mode):
        raise ModelLoadError(
            f"{source!r} is a JevAny {meta.decision_mode} checkpoint; readout {readout!r} was requested"
        )
    if readout == "choice" and meta.special_embeddings:
        # JevAny's rule: the choice prompt never uses the trained delimiter rows, and
        # the choice readout is not validated on checkpoints that trained them.
        raise ModelLoadError(f"{source!r} is a checkpoint with trained special embeddings; the choice "
                             "readout is not validated for those")
    # Through the choice readout, the file's temperature still serves the native blend.
    if (temperature is None or readout == "choice") and not _valid_temperature(meta.temperature):
        raise ModelLoadError(f"{source!r}: temperature in {HEAD_FILE} must be positive and finite, "
                             f"got {meta.temperature!r}")
    if meta.decision_mode == "pointer" and not meta.head:
        raise ModelLoadError(f"{source!r}: pointer checkpoint has no head weights in {HEAD_FILE}")
    if meta.decision_mode == "lm_token" and not meta.verbalizers:
        raise ModelLoadError(f"{source!r}: lm_token checkpoint has no verbalizers in {HEAD_FILE}")


def _verbalizer_ids(meta: Meta, tokenizer) -> list[int]:
    ids = []
    for symbol in meta.verbalizers:
        encoded = tokenizer.encode(symbol, add_special_tokens=False)
        if len(encoded) != 1:
            raise ModelLoadError(f"verbalizer {symbol!r} is {len(encoded)} tokens for this tokenizer, not one")
        ids.append(encoded[0])
    if len(set(ids)) != len(ids):
        raise ModelLoadError("verbalizers map to repeated token ids")
    return ids


def _pointer_head(meta: Meta, causal_lm, device: torch.device, source: str) -> PointerHead:
    hidden = causal_lm.get_input_embeddings().weight.shape[1]
    head = PointerHead(hidden, meta.head_dim, meta.head_residual_dim)
    try:
        head.load_state_dict(meta.head, strict=True)
    except Exception as exc:
        raise ModelLoadError(f"{source!r}: pointer head does not match {HEAD_FILE} metadata: {exc}") from exc
    return _freeze(head, device)
