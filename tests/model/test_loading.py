import shutil

import pytest
import torch

from jevany_daemon.model.checkpoint import DECISION_TOKENS, read_meta
from jevany_daemon.model.decision_model import DecisionModel
from jevany_daemon.model.loading import ModelLoadError, default_model_id, load_model
from jevany_daemon.model.pointer_head import PointerHead

ARCHS = ("qwen3", "qwen3_5")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("readout", ["choice", "pointer", "lm_token"])
def test_loads_with_its_readout(loaded_model, arch, readout):
    model = loaded_model(arch, readout)
    assert isinstance(model, DecisionModel)
    assert model.readout == readout
    assert model.device == torch.device("cpu") and model.dtype == torch.float32
    assert not model.causal_lm.training
    assert not any(p.requires_grad for p in model.causal_lm.parameters())
    assert model.hybrid == (arch == "qwen3_5")
    assert model.context_window == 4096
    assert model.info["attn_implementation"] == "sdpa"
    if readout == "choice":
        assert model.decision_tokens is None and model.info["kind"] == "causal-lm"
    else:
        assert model.decision_tokens == DECISION_TOKENS
        assert model.info["kind"] == "jevany-checkpoint" and model.info["lora"] == 4


def test_pointer_head_equals_what_was_saved(tiny_model, loaded_model):
    model = loaded_model("qwen3", "pointer")
    saved = read_meta(tiny_model("qwen3", "pointer")).head
    assert isinstance(model.head, PointerHead) and model.head.residual is not None
    state = model.head.state_dict()
    assert state.keys() == saved.keys()
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    assert all(v.dtype == torch.float32 for v in state.values())
    assert not model.head.training and not any(p.requires_grad for p in model.head.parameters())
    assert model.temperature == 1.0 and model.verbalizer_ids == []


def test_lm_token_verbalizers_are_single_tokens(tiny_model, loaded_model):
    model = loaded_model("qwen3", "lm_token")
    symbols = read_meta(tiny_model("qwen3", "lm_token")).verbalizers
    assert model.head is None
    assert len(model.verbalizer_ids) == len(symbols) == 255
    for symbol, token_id in zip(symbols, model.verbalizer_ids):
        assert model.tokenizer.encode(symbol, add_special_tokens=False) == [token_id]
        assert model.tokenizer.decode([token_id]) == symbol
    assert model.temperature == 1.5  # from head.pt


def test_temperature_argument_overrides_meta(tiny_model):
    model = load_model(str(tiny_model("qwen3", "lm_token")), temperature=0.5)
    assert model.temperature == 0.5


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature_is_refused(tiny_model, bad):
    with pytest.raises(ModelLoadError, match="temperature"):
        load_model(str(tiny_model("qwen3", "pointer")), temperature=bad)


def test_readout_may_be_named_when_it_matches(tiny_model):
    assert load_model(str(tiny_model("qwen3", "pointer")), readout="pointer").readout == "pointer"
    assert load_model(str(tiny_model("qwen3")), readout="choice").readout == "choice"


def test_bf16_casts_the_model_but_keeps_the_head_fp32(tiny_model):
    model = load_model(str(tiny_model("qwen3", "pointer")), dtype="bf16")
    assert model.dtype == torch.bfloat16
    assert {p.dtype for p in model.causal_lm.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.head.parameters()} == {torch.float32}
    # RoPE frequencies stay fp32, exactly as from_pretrained(dtype=bf16) leaves them.
    plain = load_model(str(tiny_model("qwen3")), dtype="bf16")
    for loaded in (model, plain):
        buffers = {n: b for n, b in loaded.causal_lm.named_buffers() if "inv_freq" in n}
        assert buffers and all(b.dtype == torch.float32 for b in buffers.values())


# -- model ids -------------------------------------------------------------------------------

@pytest.mark.parametrize("source, expected", [
    ("SimpleJev/JevAny-Qwen3.8-27B-LoRA", "jevany-qwen3.8-27b-lora"),
    ("SimpleJev/JevAny-Qwen3.8-27B-LoRA@main", "jevany-qwen3.8-27b-lora"),
    ("/mirror/SimpleJev/JevAny-Qwen3.8-27B-LoRA/", "jevany-qwen3.8-27b-lora"),
    ("tianxinwei/JevAny-27B-SFT", "jevany-27b"),
    ("tianxinwei/JevAny-27B-RLCR", "jevany-27b"),
    ("tianxinwei/JevAny-27B-Other", "JevAny-27B-Other"),
    ("Qwen/Qwen3-0.6B@abc123", "Qwen3-0.6B"),
    ("/models/runs/my-run/", "my-run"),
    ("my-run", "my-run"),
])
def test_default_model_id(source, expected):
    assert default_model_id(source) == expected


def test_default_model_id_of_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert default_model_id(".") == default_model_id("./") == tmp_path.name


def test_model_id_defaults_to_the_directory_name_and_can_be_set(tiny_model, loaded_model):
    assert loaded_model("qwen3", "pointer").model_id == tiny_model("qwen3", "pointer").name
    assert load_model(str(tiny_model("qwen3")), model_id="prod").model_id == "prod"


# -- base resolution -------------------------------------------------------------------------

def checkpoint_copy(src, dst, base=None, **meta_changes):
    """A run directory with src's files but no base copy: head.pt points at src's base or `base`."""
    dst.mkdir()
    for item in src.iterdir():
        if item.is_file():
            shutil.copy(item, dst / item.name)
    data = read_meta(src).to_dict()
    data.update(base=str(base or src / "base"), **meta_changes)
    torch.save(data, dst / "head.pt")
    return dst


def test_base_may_be_an_absolute_directory(tiny_model, loaded_model, tmp_path):
    src = tiny_model("qwen3", "pointer")
    model = load_model(str(checkpoint_copy(src, tmp_path / "run")))
    assert model.info["base"] == str(src / "base")
    ids = model.tokenizer("hello", return_tensors="pt")
    with torch.no_grad():
        expected = loaded_model("qwen3", "pointer").backbone(**ids).last_hidden_state
        assert torch.equal(model.backbone(**ids).last_hidden_state, expected)


def test_base_load_path_environment_substitutes_a_mirror(tiny_model, tmp_path, monkeypatch):
    src = tiny_model("qwen3", "pointer")
    run = checkpoint_copy(src, tmp_path / "run", base="Nobody/not-on-this-machine")
    monkeypatch.setenv("JEVANY_BASE_LOAD_PATH", str(src / "base"))
    assert load_model(str(run)).info["base"] == str(src / "base")
    monkeypatch.setenv("JEVANY_BASE_LOAD_PATH", str(tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match="JEVANY_BASE_LOAD_PATH is not a directory"):
        load_model(str(run))


def test_tokenizer_from_the_base_when_not_saved(tiny_model, tmp_path):
    run = checkpoint_copy(tiny_model("qwen3", "pointer"), tmp_path / "run", tokenizer_saved=False)
    model = load_model(str(run))
    # The base tokenizer records no alphabet; resolution finds the v1 tokens by looking.
    assert "jevany_decision_tokens" not in model.tokenizer.init_kwargs
    assert model.decision_tokens == DECISION_TOKENS


# -- errors ----------------------------------------------------------------------------------

def test_empty_source():
    with pytest.raises(ModelLoadError, match="no model source"):
        load_model("  ")


def test_head_file_with_a_bad_temperature(tiny_model, tmp_path):
    run = checkpoint_copy(tiny_model("qwen3", "pointer"), tmp_path / "run", temperature=0.0)
    with pytest.raises(ModelLoadError, match="temperature in head.pt"):
        load_model(str(run))
    assert load_model(str(run), temperature=2.0).temperature == 2.0  # an override makes it moot


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="model does not exist"):
        load_model(str(tmp_path / "nothing" / "here"))


def test_a_file_is_not_a_model(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_model(str(tmp_path / "f"))


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="Nobody/not-a-model.*Hugging Face hub"):
        load_model("Nobody/not-a-model@v1")


def test_plain_model_supports_only_choice(tiny_model):
    for readout in ("pointer", "lm_token"):
        with pytest.raises(ModelLoadError, match="only the choice readout"):
            load_model(str(tiny_model("qwen3")), readout=readout)


def test_checkpoint_refuses_another_readout(tiny_model):
    with pytest.raises(ModelLoadError, match="pointer checkpoint; readout 'lm_token'"):
        load_model(str(tiny_model("qwen3", "pointer")), readout="lm_token")
    with pytest.raises(ModelLoadError, match="unknown readout"):
        load_model(str(tiny_model("qwen3", "pointer")), readout="letter")


@pytest.mark.parametrize("native", ["pointer", "lm_token"])
def test_a_checkpoint_served_by_the_choice_readout_keeps_its_own(tiny_model, loaded_model, native):
    model = load_model(str(tiny_model("qwen3", native)), readout="choice")
    served = loaded_model("qwen3", native)
    assert model.readout == "choice" and model.native_readout == native
    assert model.info["decision_mode"] == native and model.decision_tokens == DECISION_TOKENS
    # The trained temperature calibrates the native readout; the choice readout starts at 1.
    assert model.temperature == 1.0 and model.native_temperature == served.temperature
    view = model.native()
    assert view.readout == native and view.temperature == served.temperature and view.native_readout is None
    assert view.causal_lm is model.causal_lm and view.verbalizer_ids == served.verbalizer_ids
    assert (view.head is None) == (native == "lm_token")
    assert load_model(str(tiny_model("qwen3", native)), readout="choice", temperature=0.5).temperature == 0.5


def test_a_plain_model_has_no_native_view(loaded_model):
    with pytest.raises(ValueError, match="no native readout"):
        loaded_model("qwen3", "choice").native()


def test_the_choice_readout_refuses_trained_special_embeddings(tiny_model, tmp_path):
    meta = torch.load(tiny_model("qwen3", "pointer") / "head.pt", weights_only=True)
    torch.save({**meta, "special_embeddings": True}, tmp_path / "head.pt")
    with pytest.raises(ModelLoadError, match="trained special embeddings"):
        load_model(str(tmp_path), readout="choice")


def test_broken_head_file(tmp_path):
    (tmp_path / "head.pt").write_bytes(b"\x00garbage")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_model(str(tmp_path))


def test_head_file_without_base(tmp_path):
    torch.save({"lora": 4}, tmp_path / "head.pt")
    with pytest.raises(ModelLoadError, match="no base model"):
        load_model(str(tmp_path))


def test_head_weights_that_do_not_fit(tiny_model, tmp_path):
    run = checkpoint_copy(tiny_model("qwen3", "pointer"), tmp_path / "run", head_dim=32)
    with pytest.raises(ModelLoadError, match="pointer head does not match"):
        load_model(str(run))


def test_adapter_for_another_architecture(tiny_model, tmp_path):
    run = checkpoint_copy(tiny_model("qwen3_5", "pointer"), tmp_path / "run",
                          base=tiny_model("qwen3", "pointer") / "base")
    with pytest.raises(ModelLoadError, match="(?s)cannot apply the LoRA adapter.*size mismatch"):
        load_model(str(run))


def test_adapter_with_weights_for_modules_the_base_lacks(tiny_model, tmp_path):
    from safetensors.torch import load_file, save_file

    run = checkpoint_copy(tiny_model("qwen3", "pointer"), tmp_path / "run")
    tensors = load_file(run / "adapter_model.safetensors")
    tensors["base_model.model.layers.9.self_attn.q_proj.lora_A.weight"] = torch.ones(4, 256)
    save_file(tensors, run / "adapter_model.safetensors")
    with pytest.raises(ModelLoadError, match="adapter does not match the base model.*layers.9"):
        load_model(str(run))


def test_missing_adapter_weights(tiny_model, tmp_path):
    run = checkpoint_copy(tiny_model("qwen3", "pointer"), tmp_path / "run")
    (run / "adapter_model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="adapter_model.safetensors is missing"):
        load_model(str(run))


def test_multimodal_checkpoint_needs_a_base_with_a_vision_tower(tiny_model, tmp_path):
    # Multimodal checkpoints load (test_multimodal.py); on a text base the flag is refused.
    run = checkpoint_copy(tiny_model("qwen3", "pointer"), tmp_path / "run", multimodal=True)
    with pytest.raises(ModelLoadError, match="says multimodal.*no vision tower"):
        load_model(str(run))


def test_verbalizer_that_is_not_one_token(tiny_model, tmp_path):
    symbols = read_meta(tiny_model("qwen3", "lm_token")).verbalizers[:3] + ["AB"]
    run = checkpoint_copy(tiny_model("qwen3", "lm_token"), tmp_path / "run", verbalizers=symbols)
    with pytest.raises(ModelLoadError, match="verbalizer 'AB' is 2 tokens"):
        load_model(str(run))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_cuda(tiny_model, device):
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        load_model(str(tiny_model("qwen3")), device=device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_index_out_of_range(tiny_model):
    with pytest.raises(ModelLoadError, match="CUDA device"):
        load_model(str(tiny_model("qwen3")), device=f"cuda:{torch.cuda.device_count()}")


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "mps", ""])
def test_unknown_device(tiny_model, device):
    with pytest.raises(ModelLoadError, match="unknown device"):
        load_model(str(tiny_model("qwen3")), device=device)


@pytest.mark.parametrize("dtype", ["fp64", "float32", "int8"])
def test_bad_dtype(tiny_model, dtype):
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_model(str(tiny_model("qwen3")), dtype=dtype)


def test_loading_prints_no_progress_bar_and_logs_what_loaded(tiny_model):
    """JevModel.load and the daemon print one log line, not "Loading weights: 100%|...|" (in a child
    process: the suite itself turns transformers' bars off by environment)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
            "from jevany_daemon.inprocess import JevModel\n"
            f"JevModel.load({str(tiny_model('qwen3', 'pointer'))!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "%|" not in proc.stderr and "Loading weights" not in proc.stderr, proc.stderr
    assert "event=model_loaded " in proc.stderr and "readout=pointer" in proc.stderr and "seconds=" in proc.stderr
