"""JevAny's load options on a checkpoint: the LoRA's scale, merged or kept apart, BF16 checkpoints, the base's path."""
import pytest
import torch
from peft.tuners.lora import LoraLayer

from jevany_daemon.config import EngineConfig, LoadOptions
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import ModelLoadError, load_model

from .test_loading import checkpoint_copy

BODY = {"state": "a parcel two weeks late", "questions": {
    "q": {"type": "choice", "criteria": {"refund": None, "resend": "ship again", "wait": None}},
    "u": {"type": "noul"}}}


def hidden(model) -> torch.Tensor:
    ids = model.tokenizer("a parcel two weeks late", return_tensors="pt")
    with torch.no_grad():
        return model.backbone(**ids.to(model.device)).last_hidden_state.float()


def probabilities(model) -> list[float]:
    answers = Engine(model, EngineConfig()).decide(BODY)["answers"]
    return [*answers["q"]["probabilities"].values(), *answers["u"]["probabilities"].values()]


def lora_layers(model) -> int:
    return sum(isinstance(m, LoraLayer) for m in model.backbone.modules())


def test_lora_scale_interpolates_from_the_base_to_the_trained_model(tiny_model, loaded_model):
    run = tiny_model("qwen3", "pointer")
    base = load_model(str(run / "base"))                       # the base alone, as a plain causal LM
    trained = hidden(loaded_model("qwen3", "pointer"))
    none = load_model(str(run), options=LoadOptions(lora_scale=0.0))
    assert torch.allclose(hidden(none), hidden(base), atol=1e-6) and none.info["lora_scale"] == 0.0
    half = hidden(load_model(str(run), options=LoadOptions(lora_scale=0.5)))
    assert not torch.allclose(half, trained, atol=1e-4) and not torch.allclose(half, hidden(base), atol=1e-4)


def test_merge_off_keeps_the_adapter_apart_with_the_same_answers(tiny_model, loaded_model):
    merged = loaded_model("qwen3", "pointer")
    apart = load_model(str(tiny_model("qwen3", "pointer")), options=LoadOptions(merge=False))
    assert (merged.info["lora_merged"], lora_layers(merged)) == (True, 0)
    assert apart.info["lora_merged"] is False and lora_layers(apart) > 0
    got, want = probabilities(apart), probabilities(merged)
    assert max(abs(a - b) for a, b in zip(got, want)) <= 1e-5
    described = Engine(apart).describe()["acceleration"]
    assert (described["lora_merged"], described["approximate_bf16_merge"]) == (False, False)


def test_a_bf16_trained_checkpoint_serves_in_bf16_apart_unless_merge_bf16(tiny_model, tmp_path):
    run = checkpoint_copy(tiny_model("qwen3", "pointer"), tmp_path / "run", weights_dtype="bf16")
    apart = load_model(str(run))
    assert apart.dtype == torch.bfloat16 and apart.info["lora_merged"] is False and lora_layers(apart) > 0
    adapter = next(p for n, p in apart.backbone.named_parameters() if "lora_A" in n)
    assert adapter.dtype == torch.float32                       # as PEFT keeps it beside BF16 weights
    fast = load_model(str(run), options=LoadOptions(merge_bf16=True))
    assert (fast.dtype, fast.info["lora_merged"], fast.info["approximate_bf16_merge"]) == (torch.bfloat16, True, True)
    exact = load_model(str(run), dtype="fp32")                  # asked for: FP32, where a merge is exact
    assert (exact.dtype, exact.info["lora_merged"], exact.info["approximate_bf16_merge"]) == (torch.float32, True, False)


def test_a_direct_token_checkpoint_keeps_its_adapter_apart_below_fp32(tiny_model):
    run = str(tiny_model("qwen3", "lm_token"))
    assert load_model(run, dtype="bf16").info["lora_merged"] is False
    assert load_model(run).info["lora_merged"] is True          # FP32: merged, exactly


def test_a_relative_base_loads_from_any_working_directory(tiny_model, tmp_path, monkeypatch):
    run = tiny_model("qwen3", "pointer")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)                                # head.pt says base: "base", beside it
    assert load_model(str(run)).info["base"] == str(run / "base")
    monkeypatch.chdir(run.parent)
    assert load_model(run.name).info["named_base"] == "base"


def test_base_load_path_option_substitutes_a_mirror(tiny_model, tmp_path):
    src = tiny_model("qwen3", "pointer")
    run = checkpoint_copy(src, tmp_path / "run", base="Nobody/not-on-this-machine")
    model = load_model(str(run), options=LoadOptions(base_load_path=str(src / "base")))
    assert (model.info["base"], model.info["named_base"]) == (str(src / "base"), "Nobody/not-on-this-machine")
    with pytest.raises(ModelLoadError, match="JEVANY_BASE_LOAD_PATH is not a directory"):
        load_model(str(run), options=LoadOptions(base_load_path=str(tmp_path / "missing")))
