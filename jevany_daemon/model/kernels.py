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
    if hasattr(fn, "behind"):           # a custom op in front of it (opaque_linear_attention)
        return serving(_served[fn.behind])
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


# --- opaque to torch.compile --------------------------------------------------------------
#
# A compiled pass must trace whole (fullgraph). transformers' PyTorch code for the delta rule and
# the short convolution traces; fla's Triton kernels and causal-conv1d's CUDA kernel are launched
# from Python that dynamo may not. So a compiled model's process puts both behind custom ops:
# dynamo records one op with a known output shape, and the op calls what transformers bound,
# fla's kernels on CUDA, its PyTorch code on a CPU, exactly as an eager pass would.

# What each function was bound to before the ops stood in front: one hybrid architecture a process,
# as a worker holds one model.
_served: dict[str, object] = {}


@torch.library.custom_op("jevany::chunk_gated_delta_rule", mutates_args=())
def _delta_rule_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                   beta: torch.Tensor, initial_state: torch.Tensor | None, output_final_state: bool,
                   use_qk_l2norm_in_kernel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, final = _served[PREFILL_RULE](query, key, value, g=g, beta=beta, initial_state=initial_state,
                                        output_final_state=output_final_state,
                                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    final = final.float() if final is not None else query.new_empty(0, dtype=torch.float32)
    return out.to(query.dtype).contiguous(), final.contiguous()


@_delta_rule_op.register_fake
def _(query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    batch, _, _, k_dim = key.shape
    heads, v_dim = value.shape[-2:]
    final = (query.new_empty((batch, heads, k_dim, v_dim), dtype=torch.float32) if output_final_state
             else query.new_empty(0, dtype=torch.float32))
    return value.new_empty(value.shape, dtype=query.dtype), final


@torch.library.custom_op("jevany::causal_conv1d", mutates_args=())
def _conv_op(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             activation: str | None) -> torch.Tensor:
    out = _served["causal_conv1d_fn"](hidden_states, weight, bias, activation=activation)
    return out.to(hidden_states.dtype).contiguous()


@_conv_op.register_fake
def _(hidden_states, weight, bias, activation):
    return torch.empty_like(hidden_states, memory_format=torch.contiguous_format)


def _delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    if cu_seqlens is not None:       # rows packed end to end: only the served kernel knows them
        return _served[PREFILL_RULE](query, key, value, g=g, beta=beta, initial_state=initial_state,
                                     output_final_state=output_final_state,
                                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)
    out, final = _delta_rule_op(query, key, value, g, beta, initial_state, output_final_state,
                                use_qk_l2norm_in_kernel)
    return out, (final if output_final_state else None)


def _conv(hidden_states, weight, bias=None, activation=None, **kwargs):
    return _conv_op(hidden_states, weight, bias, activation)


_delta_rule.behind, _conv.behind = PREFILL_RULE, "causal_conv1d_fn"


def opaque_linear_attention(causal_lm) -> bool:
    """Put the prefill delta rule and the short convolution of a hybrid model's process behind custom ops
    (see above); True if it has such layers. Idempotent; the ops call what was bound before."""
    module = modeling_module(causal_lm)
    if module is None:
        return False
    for name, op in ((PREFILL_RULE, _delta_rule), ("causal_conv1d_fn", _conv)):
        served = getattr(module, name, None)
        if served is not None and not hasattr(served, "behind"):
            _served[name] = served
            setattr(module, name, op)
    return True
