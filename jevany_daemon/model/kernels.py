"""Which kernels run a hybrid model's linear-attention (Gated DeltaNet) layers.

transformers binds each linear-attention function once, when its modeling
module is imported: to flash-linear-attention's (fla) Triton kernels
whenever that package imports, else to its reference PyTorch code (and to
causal-conv1d's kernel for the short convolution, likewise). fla's kernels
refuse FP32 inputs, so with fla installed an FP32 model would fail its first
pass. At load, an FP32 model's process gets a dispatch in front of fla: FP32
inputs take the PyTorch path, anything else still takes fla. Per call, not
per process, so a BF16 model beside it keeps the fast kernels.

On a CPU host transformers advises installing those packages on first use;
they need CUDA, so the advice is noise there and is filtered out.

FP32 means FP32: on CUDA, matmuls and cuDNN may use TF32 tensor cores
(10-bit mantissas) for FP32 inputs, which moves probabilities by far more
than the 1e-5 our parity promises. An FP32 model on CUDA turns TF32 off for
its process (strict_fp32); BF16 and FP16 are untouched.

No cuDNN attention, whatever the dtype: on CUDA, torch's scaled-dot-product
attention prefers cuDNN's kernel for BF16, and cuDNN builds an execution plan
for every new shape. A served pass brings new shapes almost every time (its
rows and widths follow the requests), so the plan is built, not reused. On an
H200 (2026-12-04, gpu-check's busy phase, Qwen3.5-0.8B's shape, BF16) a pass
of one request took 96 ms with cuDNN and 59 ms without; in a second run,
with the order of the two reversed, 127 and 61 ms. The device's own work was
5 ms either way. A model on CUDA turns cuDNN's attention off for its process
(no_cudnn_attention); torch then picks the flash or memory-efficient kernel,
which need no plan.
"""
import inspect
import logging
import sys

import torch

# The delta-rule functions fla may serve, as the modeling modules name them.
PREFILL_RULE = "torch_chunk_gated_delta_rule"
DELTA_RULES = (PREFILL_RULE, "torch_recurrent_gated_delta_rule")
CONVOLUTIONS = ("causal_conv1d_fn", "causal_conv1d_update")
TORCH = "torch"
_ADVICE_LOGGER = "transformers.integrations.hub_kernels"
_ADVICE = "falling back to its reference PyTorch implementation"


def strict_fp32(device: torch.device) -> None:
    """No TF32 for FP32 matmuls and convolutions on CUDA, process-wide (a worker holds one model)."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def no_cudnn_attention(device: torch.device) -> None:
    """Scaled-dot-product attention without cuDNN's kernel on CUDA, process-wide (see above)."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def prepare(causal_lm, dtype: torch.dtype, device: torch.device) -> dict[str, str] | None:
    """Make the linear-attention path safe for dtype; {function: what serves it}, or None without such layers."""
    module = modeling_module(causal_lm)
    if module is None:
        return None
    if device.type == "cpu":
        _quiet_kernel_advice()
    if dtype == torch.float32:
        for name in DELTA_RULES:
            fn = getattr(module, name, None)
            if fn is not None and serving(fn) != TORCH and not getattr(fn, "fp32_on_torch", False):
                setattr(module, name, _fp32_on_torch(fn))
    return {name: serving(getattr(module, name)) for name in DELTA_RULES + CONVOLUTIONS if hasattr(module, name)}


def describe(paths: dict[str, str] | None) -> str | None:
    """What runs a prefill's delta rule, for the log and the models op: torch, fla, or fla (fp32 on torch).

    (The recurrent rule serves one-token decoding, which a decision model never does.)
    """
    return paths.get(PREFILL_RULE) if paths else None


def serving(fn) -> str:
    """The package behind one of transformers' kernel-or-fallback functions ("torch" for its own code)."""
    if getattr(fn, "fp32_on_torch", False):
        return f"{serving(fn.fast)} (fp32 on {TORCH})"
    try:
        found = inspect.getclosurevars(fn).nonlocals
    except (TypeError, ValueError):
        return TORCH
    if found.get("is_new_implementation"):
        return str(found.get("package") or "kernel")
    return TORCH


def modeling_module(causal_lm):
    """The transformers module that binds a hybrid model's kernel functions; None without such layers."""
    for layer in causal_lm.modules():
        attn = getattr(layer, "linear_attn", None)
        if attn is not None:
            return sys.modules[type(attn).__module__]
    return None


def reference_call(fn):
    """The reference PyTorch function under one of transformers' kernel-or-fallback functions (or under
    our FP32 dispatch in front of one), called with only the keyword arguments it takes: a kernel's own
    (fla's cu_seqlens...) are not the reference's."""
    reference = inspect.unwrap(fn.fast if getattr(fn, "fp32_on_torch", False) else fn)
    parameters = inspect.signature(reference).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return reference
    accepted = set(parameters)

    def call(*args, **kwargs):
        return reference(*args, **{k: v for k, v in kwargs.items() if k in accepted})

    return call


def _fp32_on_torch(fast):
    """fast, except that FP32 inputs go to the reference PyTorch function it wraps."""
    reference = reference_call(fast)

    def dispatch(query, *args, **kwargs):
        if query.dtype != torch.float32:
            return fast(query, *args, **kwargs)
        return reference(query, *args, **kwargs)

    dispatch.fp32_on_torch, dispatch.fast = True, fast
    return dispatch


class _DropKernelAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _ADVICE not in record.getMessage()


def _quiet_kernel_advice() -> None:
    logger = logging.getLogger(_ADVICE_LOGGER)
    if not any(isinstance(f, _DropKernelAdvice) for f in logger.filters):
        logger.addFilter(_DropKernelAdvice())
