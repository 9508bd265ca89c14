import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from jevany_daemon.model.checkpoint import DECISION_TOKENS, read_meta
from jevany_daemon.model.tiny import SPECIAL_TOKENS, build_tiny_model

ARCHS = ("qwen3", "qwen3_5")
ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def base_dir(path, readout):
    return path if readout == "choice" else path / "base"


def lora_tensors(run_dir):
    return load_file(run_dir / "adapter_model.safetensors")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("readout", ["choice", "pointer", "lm_token"])
def test_builds_and_reloads(tiny_model, arch, readout):
    path = tiny_model(arch, readout)
    base = base_dir(path, readout)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    assert type(model).__name__ == {"qwen3": "Qwen3ForCausalLM", "qwen3_5": "Qwen3_5ForCausalLM"}[arch]
    assert model.config.hidden_size == 256 and model.config.num_hidden_layers == 4
    assert model.config.max_position_embeddings == 4096
    tokenizer = AutoTokenizer.from_pretrained(base)
    assert model.config.vocab_size >= len(tokenizer)
    out = model(**tokenizer("state: hello", return_tensors="pt"))
    assert out.logits.shape[-1] == model.config.vocab_size
    assert torch.isfinite(out.logits).all()
    if readout == "choice":
        assert not (path / "head.pt").exists() and not (path / "base").exists()
    else:
        for name in ("adapter_config.json", "adapter_model.safetensors", "head.pt", "tokenizer.json"):
            assert (path / name).is_file(), name
        meta = read_meta(path)
        assert (meta.base, meta.decision_mode, meta.lora, meta.tokenizer_saved) == ("base", readout, 4, True)


def test_qwen3_ties_embeddings_and_qwen3_5_does_not(tiny_model):
    qwen3 = AutoModelForCausalLM.from_pretrained(tiny_model("qwen3"))
    assert qwen3.get_output_embeddings().weight.data_ptr() == qwen3.get_input_embeddings().weight.data_ptr()
    qwen35 = AutoModelForCausalLM.from_pretrained(tiny_model("qwen3_5"))
    assert not torch.equal(qwen35.get_output_embeddings().weight, qwen35.get_input_embeddings().weight)


def test_qwen3_5_is_hybrid(tiny_model):
    config = json.loads((tiny_model("qwen3_5") / "config.json").read_text())
    # a full-attention layer before the last, so padding's attention output feeds a later recurrence
    assert config["layer_types"] == ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model("qwen3_5"))
    assert hasattr(model.get_decoder().layers[0], "linear_attn")
    assert hasattr(model.get_decoder().layers[1], "self_attn")
    assert hasattr(model.get_decoder().layers[2], "linear_attn")


def test_tiny8_has_the_real_layer_pattern(tmp_path):
    from jevany_daemon.model.tiny import build_tiny_model

    config = json.loads((build_tiny_model(tmp_path / "m", arch="qwen3_5", shape="tiny8") / "config.json").read_text())
    assert config["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert config["hidden_size"] == 256


@pytest.mark.parametrize("arch", ARCHS)
def test_same_seed_same_model_other_seed_other_model(tiny_model, tmp_path, arch):
    reference = load_file(tiny_model(arch) / "model.safetensors")
    again = load_file(build_tiny_model(tmp_path / "again", arch, seed=0) / "model.safetensors")
    other = load_file(build_tiny_model(tmp_path / "other", arch, seed=1) / "model.safetensors")
    assert reference.keys() == again.keys()
    assert all(torch.equal(reference[k], again[k]) for k in reference)
    assert not all(torch.equal(reference[k], other[k]) for k in reference)


def test_same_seed_same_adapter_and_head(tiny_model, tmp_path):
    reference = tiny_model("qwen3", "pointer")
    again = build_tiny_model(tmp_path / "again", "qwen3", "pointer", seed=0)
    a, b = lora_tensors(reference), lora_tensors(again)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    head_a, head_b = read_meta(reference).head, read_meta(again).head
    assert all(torch.equal(head_a[k], head_b[k]) for k in head_a)


def test_build_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", "qwen3", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "head.pt").write_bytes(b"stale")
    with pytest.raises(FileExistsError):
        build_tiny_model(tmp_path, "qwen3")


def test_rejects_unknown_arch_and_readout(tmp_path):
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model(tmp_path / "a", arch="llama")
    with pytest.raises(ValueError, match="readout"):
        build_tiny_model(tmp_path / "b", readout="letter")


# -- tokenizer -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model("qwen3"))


def test_special_tokens_are_single_tokens(tokenizer):
    ids = set()
    for token in SPECIAL_TOKENS:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        assert len(encoded) == 1, token
        assert tokenizer.convert_ids_to_tokens(encoded[0]) == token
        ids.add(encoded[0])
    assert len(ids) == len(SPECIAL_TOKENS)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert set(DECISION_TOKENS) <= set(tokenizer.all_special_tokens)


def test_alphanumerics_are_single_tokens_that_decode_to_themselves(tokenizer):
    for ch in ALNUM:
        encoded = tokenizer.encode(ch, add_special_tokens=False)
        assert len(encoded) == 1, ch
        assert tokenizer.decode(encoded) == ch


def test_vocabulary_is_about_two_thousand(tokenizer):
    assert 1800 <= len(tokenizer) <= 2000


def test_typical_request_text_is_compact(tokenizer):
    text = '{"name": "red car", "price": 12.50, "status": "ok"}\nstate:\n  player: white\n  turn: 12'
    assert len(tokenizer.encode(text, add_special_tokens=False)) < len(text) / 2


def test_chat_template_renders_a_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Pick one."}]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nPick one.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert not without.endswith("assistant\n")


def test_run_dir_tokenizer_records_its_decision_tokens(tiny_model):
    run_tok = AutoTokenizer.from_pretrained(tiny_model("qwen3", "pointer"))
    assert run_tok.init_kwargs["jevany_decision_tokens"] == list(DECISION_TOKENS)
    base_tok = AutoTokenizer.from_pretrained(tiny_model("qwen3", "pointer") / "base")
    assert "jevany_decision_tokens" not in base_tok.init_kwargs


# -- JevAny run directories ------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_lora_adapter_targets_the_backbone_with_nonzero_weights(tiny_model, arch):
    run_dir = tiny_model(arch, "pointer")
    tensors = lora_tensors(run_dir)
    assert all(k.startswith("base_model.model.layers.") for k in tensors)  # the decoder, not the CausalLM
    lora_b = [v for k, v in tensors.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)
    config = json.loads((run_dir / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["task_type"]) == (4, 8, "FEATURE_EXTRACTION")
    expected = {"q_proj", "k_proj", "v_proj", "o_proj"}
    if arch == "qwen3_5":
        expected |= {"in_proj_qkv", "in_proj_z", "out_proj"}
        assert any(".linear_attn.in_proj_qkv." in k for k in tensors)
    assert set(config["target_modules"]) == expected


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("arch", ARCHS)
def test_merged_adapter_changes_hidden_states_exactly_as_peft_does(tiny_model, loaded_model, arch):
    from peft import PeftModel

    run_dir = tiny_model(arch, "pointer")
    model = loaded_model(arch, "pointer")
    inputs = model.tokenizer("<|jev_state|>turn: 12<|jev_decide|>", return_tensors="pt")
    base = AutoModelForCausalLM.from_pretrained(run_dir / "base", dtype=torch.float32).eval()
    with torch.no_grad():
        merged = model.backbone(**inputs).last_hidden_state
        plain = base.get_decoder()(**inputs).last_hidden_state
        unmerged = PeftModel.from_pretrained(base.get_decoder(), run_dir)(**inputs).last_hidden_state
    assert (merged - plain).abs().max() > 1e-3
    assert (merged - unmerged).abs().max() < 1e-5


def test_pointer_head_meta(tiny_model):
    meta = read_meta(tiny_model("qwen3", "pointer"))
    assert (meta.head_dim, meta.head_residual_dim, meta.head_type, meta.temperature) == (64, 16, "residual", 1.0)
    assert meta.head["q.weight"].shape == (64, 256)
    assert meta.head["residual.2.weight"].abs().sum() > 0  # the residual branch really contributes
    assert meta.verbalizers == [] and not meta.multimodal and not meta.special_embeddings


def test_lm_token_meta_has_a_full_verbalizer_table(tiny_model):
    meta = read_meta(tiny_model("qwen3", "lm_token"))
    assert meta.head is None and meta.temperature == 1.5
    assert len(meta.verbalizers) == 255 == len(set(meta.verbalizers))
    assert "".join(meta.verbalizers[:62]) == ALNUM
    assert meta.verbalizers[62] == "\u00a1"
