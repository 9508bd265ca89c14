"""Linear-attention kernels: FP32 never reaches a kernel that refuses it; CPU hosts get no CUDA advice."""
import json
import subprocess
import sys
import types

import pytest
import torch
from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback
from transformers.models.qwen3_5 import modeling_qwen3_5

from jevany_client.errors import InternalError
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model

BODY = {"state": {"ticket": "late parcel"},
        "questions": {"act": {"type": "choice", "criteria": {"refund": None, "resend": None}},
                      "urgent": {"type": "noul"}}}


@pytest.fixture
def fla_installed(monkeypatch):
    """flash-linear-attention as transformers sees it, bound the way transformers binds it, refusing FP32
    as the real kernels do. Returns the dtypes it was called with."""
    reference = modeling_qwen3_5.torch_chunk_gated_delta_rule.__wrapped__
    calls = []

    def chunk_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, **kwargs):
        if query.dtype == torch.float32:
            raise NotImplementedError("fla kernels do not support float32 inputs")
        calls.append(query.dtype)
        return reference(query, key, value, g, beta, initial_state=initial_state,
                         output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    monkeypatch.setitem(sys.modules, "fake_fla", types.SimpleNamespace(chunk_gated_delta_rule=chunk_gated_delta_rule))
    bound = use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule", "fake_fla")(reference)
    monkeypatch.setattr(modeling_qwen3_5, "torch_chunk_gated_delta_rule", bound)
    return calls


def _engine(model):
    return Engine(model, EngineConfig(layout="shared", max_batch_size=4))


def test_fp32_takes_the_torch_path_when_fla_is_installed(tiny_model, fla_installed):
    source = str(tiny_model("qwen3_5", "pointer"))
    raw = load_model(source, device="cpu", dtype="fp32")
    # the emulation refuses fp32 as fla does, so without the dispatch a pass fails...
    modeling_qwen3_5.torch_chunk_gated_delta_rule, dispatch = (
        modeling_qwen3_5.torch_chunk_gated_delta_rule.fast, modeling_qwen3_5.torch_chunk_gated_delta_rule)
    engine = _engine(raw)
    failed = engine.run_batch([engine.admit(BODY)])[0]
    assert isinstance(failed, InternalError) and "float32" in failed.message
    modeling_qwen3_5.torch_chunk_gated_delta_rule = dispatch
    # ...and with it, fp32 scores on the PyTorch path
    fp32 = load_model(source, device="cpu", dtype="fp32")
    assert fp32.info["linear_attention"] == "fake_fla (fp32 on torch)"
    assert isinstance(_engine(fp32).decide(BODY), dict)
    assert fla_installed == []
    # a bf16 model in the same process still gets the fast kernels
    bf16 = load_model(source, device="cpu", dtype="bf16")
    assert isinstance(_engine(bf16).decide(BODY), dict)
    assert torch.bfloat16 in fla_installed


def test_without_fla_the_torch_path_serves(loaded_model):
    assert loaded_model("qwen3_5", "choice").info["linear_attention"] == "torch"
    assert loaded_model("qwen3", "choice").info["linear_attention"] is None   # no linear-attention layers


def test_a_cpu_host_is_not_told_to_install_cuda_kernels(tiny_model):
    script = ("import sys; from jevany_daemon.inprocess import JevModel; "
              "import json; JevModel.load(sys.argv[1]).decide_body(json.loads(sys.argv[2]))")
    proc = subprocess.run([sys.executable, "-c", script, str(tiny_model("qwen3_5", "choice")),
                           json.dumps(BODY)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "falling back to its reference PyTorch implementation" not in proc.stderr


def test_fp32_on_cuda_turns_tf32_off_and_leaves_the_cpu_alone():
    import torch

    from jevany_daemon.model.kernels import strict_fp32

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        strict_fp32(torch.device("cpu"))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        strict_fp32(torch.device("cuda", 0))      # flags only: no CUDA needed to set them
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def test_a_model_on_cuda_turns_cudnn_attention_off_and_the_cpu_leaves_it_alone():
    # cuDNN builds a plan per new shape, and served passes bring new shapes: a pass of one took
    # twice as long with it on an H200 (kernels.py). Flags only: no CUDA needed to set or read them.
    import torch

    from jevany_daemon.model.kernels import no_cudnn_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        no_cudnn_attention(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        no_cudnn_attention(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_the_linear_attention_custom_ops_answer_as_what_serves_them_and_declare_their_shapes(monkeypatch):
    from jevany_daemon.model import kernels

    for name in (kernels.PREFILL_RULE, *kernels.CONVOLUTIONS):
        monkeypatch.setattr(modeling_qwen3_5, name, getattr(modeling_qwen3_5, name))
    rule, conv = modeling_qwen3_5.torch_chunk_gated_delta_rule, modeling_qwen3_5.causal_conv1d_fn
    # A model whose layers say which modeling module binds their functions (as modeling_module reads it)
    layer = types.SimpleNamespace(linear_attn=modeling_qwen3_5.Qwen3_5GatedDeltaNet.__new__(
        modeling_qwen3_5.Qwen3_5GatedDeltaNet))
    assert kernels.opaque_linear_attention(types.SimpleNamespace(modules=lambda: [layer]))
    assert modeling_qwen3_5.torch_chunk_gated_delta_rule is not rule and modeling_qwen3_5.causal_conv1d_fn is not conv
    assert kernels.serving(modeling_qwen3_5.torch_chunk_gated_delta_rule) == "torch"     # what stands behind
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 40, 2, 8, generator=gen) for _ in range(2))
    v = torch.randn(2, 40, 4, 8, generator=gen)
    g, beta = -torch.rand(2, 40, 4, generator=gen), torch.rand(2, 40, 4, generator=gen)
    state = torch.randn(2, 4, 8, 8, generator=gen)
    for final in (True, False):
        want = rule(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=final,
                    use_qk_l2norm_in_kernel=True)
        got = modeling_qwen3_5.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                             output_final_state=final, use_qk_l2norm_in_kernel=True)
        assert torch.equal(got[0], want[0]) and (got[1] is None) == (not final)
        if final:
            assert torch.equal(got[1], want[1])
        torch.library.opcheck(kernels._delta_rule_op, (q, k, v, g, beta, state, final, True))
    x, w, b = torch.randn(2, 16, 40, generator=gen), torch.randn(16, 4, generator=gen), torch.randn(16, generator=gen)
    assert torch.equal(modeling_qwen3_5.causal_conv1d_fn(x, w, b, activation="silu"), conv(x, w, b, activation="silu"))
    torch.library.opcheck(kernels._conv_op, (x, w, b, "silu"))
