"""The tiny multimodal model: built offline, loaded as plain directory and JevAny run, read with media.

Media files are made here (Pillow, PyAV), never committed.
"""
import importlib.util
import json

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("PIL", reason="the multimodal processor needs Pillow")

from jevany_daemon.cli import app  # noqa: E402
from jevany_daemon.model.checkpoint import read_meta  # noqa: E402
from jevany_daemon.model.loading import ModelLoadError, load_model  # noqa: E402
from jevany_daemon.model.multimodal import MediaError, media_hidden_states, read_video  # noqa: E402
from jevany_daemon.model.tiny import build_tiny_model  # noqa: E402
from jevany_daemon.model.tiny_vision import (  # noqa: E402
    IMAGE_TOKEN,
    MERGE_SIZE,
    PATCH_SIZE,
    VIDEO_TOKEN,
    build_processors,
)
from tests.media.clips import gradients, steps, write_clip  # noqa: E402

HIDDEN = 256
PROMPT = "<|jev_state|>order 66 arrived late<|jev_question|>refund?<|jev_decide|>"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{readout: directory} of multimodal tiny models, built once for the module."""
    root = tmp_path_factory.mktemp("tiny-mm")
    return {r: build_tiny_model(root / r, arch="qwen3_5", readout=r, multimodal=True) for r in ("choice", "pointer")}


@pytest.fixture(scope="module")
def loaded(built):
    return {r: load_model(str(path), media=True) for r, path in built.items()}


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("media") / "gradient.png"
    image = Image.new("RGB", (48, 32))
    image.putdata([(x * 5, y * 7, (x + y) * 3) for y in range(32) for x in range(48)])
    image.save(path)
    return path


def write_video(path, frames: int, fps: int = 4):
    """An MPEG-4 clip of 32 x 32 grey frames, frame i of brightness 30 i."""
    return write_clip(path, steps(frames), fps=fps)


@pytest.fixture(scope="module")
def video_file(tmp_path_factory):
    return write_video(tmp_path_factory.mktemp("media") / "clip.mp4", frames=8)


def needs(model, kind):
    if kind not in model.media_types:
        pytest.skip(f"{kind} is not served here: {model.info.get('media_unavailable')}")


def test_builds_offline_small_with_its_processor(built):
    plain, run = built["choice"], built["pointer"]
    config = json.loads((plain / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert config["vision_config"]["patch_size"] == PATCH_SIZE
    assert (plain / "processor_config.json").is_file() and (plain / "chat_template.jinja").is_file()
    assert sum(f.stat().st_size for f in plain.iterdir()) < 20e6
    meta = read_meta(run)
    assert meta.multimodal and meta.decision_mode == "pointer" and meta.lora == 4
    for name in ("adapter_model.safetensors", "processor_config.json", "tokenizer.json"):
        assert (run / name).is_file(), name


def test_same_seed_same_model(built, tmp_path):
    again = build_tiny_model(tmp_path / "again", arch="qwen3_5", multimodal=True)
    assert (again / "model.safetensors").read_bytes() == (built["choice"] / "model.safetensors").read_bytes()


def test_only_qwen3_5_is_multimodal(tmp_path):
    with pytest.raises(ValueError, match="qwen3_5"):
        build_tiny_model(tmp_path / "m", arch="qwen3", multimodal=True)


def test_plain_directory_loads_whole(loaded):
    model = loaded["choice"]
    assert type(model.causal_lm).__name__ == "Qwen3_5ForConditionalGeneration"
    assert model.multimodal and model.processor is not None and "image" in model.media_types
    assert model.info["multimodal"] and model.info["media_types"] == list(model.media_types)
    # The engine's text path: the language model, as on a text qwen3_5 model.
    assert type(model.backbone).__name__ == "Qwen3_5TextModel"
    assert model.backbone is model.causal_lm.model.language_model
    assert (model.model_type, model.hybrid, model.context_window) == ("qwen3_5_text", True, 4096)
    assert model.processor.tokenizer is model.tokenizer
    if "video" not in model.media_types:
        assert "video" in model.info["media_unavailable"]


def test_run_directory_loads_with_lora_and_head(loaded):
    model, plain = loaded["pointer"], loaded["choice"]
    assert model.readout == "pointer" and model.head is not None
    assert model.multimodal and "image" in model.media_types and model.info["kind"] == "jevany-checkpoint"
    assert model.processor.tokenizer is model.tokenizer
    merged = model.backbone.layers[1].self_attn.q_proj.weight
    assert not torch.equal(merged, plain.backbone.layers[1].self_attn.q_proj.weight)
    # The LoRA is on the language model only; the vision tower is the base's.
    vision, base_vision = model.causal_lm.model.visual, plain.causal_lm.model.visual
    assert all(torch.equal(a, b) for a, b in zip(vision.parameters(), base_vision.parameters()))


def test_run_directory_without_its_own_processor_uses_the_bases(built, tmp_path, image_file):
    import shutil

    run = shutil.copytree(built["pointer"], tmp_path / "run")
    (run / "processor_config.json").unlink()
    model = load_model(str(run), readout="choice")
    assert model.readout == "choice" and model.native_readout == "pointer"
    assert model.processor.tokenizer is model.tokenizer and "image" in model.media_types
    assert torch.isfinite(media_hidden_states(model, PROMPT, [("image", image_file)]).hidden).all()


def test_image_forward(loaded, image_file):
    model = loaded["pointer"]
    needs(model, "image")
    out = media_hidden_states(model, PROMPT, [("image", image_file)])
    prompt_ids = model.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert out.hidden.shape == (1, out.prompt_start + len(prompt_ids), HIDDEN)
    assert torch.isfinite(out.hidden).all()
    assert out.input_ids[0, out.prompt_start:].tolist() == prompt_ids
    # 48 x 32 pixels (within the tiny processor's bounds, so not resized): 6 x 4 patches,
    # merged 2 x 2 into 6 placeholders.
    image_id = model.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert int((out.input_ids == image_id).sum()) == (48 // PATCH_SIZE) * (32 // PATCH_SIZE) // MERGE_SIZE ** 2
    again = media_hidden_states(model, PROMPT, [("image", image_file)])
    assert torch.equal(out.hidden, again.hidden)
    text_only = media_hidden_states(model, PROMPT, [])
    # The image is read: the decision position sees it.
    assert not torch.allclose(out.hidden[0, -1], text_only.hidden[0, -1])


def test_video_frames_are_sampled_and_decoded(video_file, tmp_path):
    # Decoding and sampling need no torchvision: they run everywhere PyAV does.
    videos = build_processors()[1]
    frames, metadata = read_video(videos, video_file)
    # 8 frames at 4 fps are 2 seconds; the processor samples 2 a second, evenly.
    assert metadata.frames_indices == [0, 2, 5, 7] and (metadata.total_num_frames, metadata.fps) == (8, 4.0)
    assert frames.shape == (4, 32, 32, 3) and frames.dtype.name == "uint8"
    assert [round(float(f.mean()) / 30) for f in frames] == [0, 2, 5, 7]
    # The vision tower reads frames in pairs: a one-frame clip repeats its frame.
    frames, metadata = read_video(videos, write_video(tmp_path / "one.mp4", frames=1))
    assert metadata.frames_indices == [0, 0] and frames.shape[0] == 2
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    with pytest.raises(MediaError, match="video could not be decoded"):
        read_video(videos, broken)


def test_video_forward(loaded, video_file):
    model = loaded["choice"]
    needs(model, "video")
    out = media_hidden_states(model, PROMPT, [("video", video_file)])
    assert out.hidden.shape[:2] == out.input_ids.shape and out.hidden.shape[-1] == HIDDEN
    assert torch.isfinite(out.hidden).all()
    # 4 frames sampled (2 a second), 32 x 32 (within the tiny bounds, so not resized): 2 temporal
    # patches of 4 x 4 patches, each merged 2 x 2 into 4 placeholders, every one behind its
    # timestamp, the middle of its frames (0 and 0.5 s, 1.25 and 1.75 s).
    video_id = model.tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
    assert int((out.input_ids == video_id).sum()) == 2 * (32 // PATCH_SIZE) ** 2 // MERGE_SIZE ** 2
    text = model.tokenizer.decode(out.input_ids[0, :out.prompt_start])
    assert "<0.2 seconds>" in text and "<1.5 seconds>" in text
    assert torch.equal(out.hidden, media_hidden_states(model, PROMPT, [("video", video_file)]).hidden)


def test_image_and_video_in_one_pass(loaded, image_file, video_file):
    model = loaded["choice"]
    needs(model, "image")
    needs(model, "video")
    out = media_hidden_states(model, PROMPT, [("image", image_file), ("video", video_file)])
    assert torch.isfinite(out.hidden).all()


def test_text_path_is_the_text_models(built, loaded):
    # The engine's backbone on a multimodal model computes what the same directory
    # loaded as a text-only causal LM computes: the same language model, bit for bit.
    from transformers import AutoModelForCausalLM

    model = loaded["choice"]
    text = AutoModelForCausalLM.from_pretrained(built["choice"], dtype=torch.float32).eval()
    assert type(text).__name__ == "Qwen3_5ForCausalLM"
    ids = model.tokenizer(PROMPT, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        expected = text.get_decoder()(input_ids=ids).last_hidden_state
        assert torch.equal(model.backbone(input_ids=ids).last_hidden_state, expected)


def test_text_only_is_the_backbone_pass(loaded):
    model = loaded["pointer"]
    ids = model.tokenizer(PROMPT, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        backbone = model.backbone(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    whole = media_hidden_states(model, ids[0].tolist(), [])
    assert whole.prompt_start == 0 and torch.isfinite(backbone).all()
    assert torch.equal(whole.hidden, backbone)
    with torch.inference_mode():
        again = model.backbone(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    assert torch.equal(again, backbone)


def test_refuses_what_it_cannot_read(loaded, image_file, tmp_path):
    model = loaded["choice"]
    needs(model, "image")
    with pytest.raises(MediaError, match="audio"):
        media_hidden_states(model, PROMPT, [("audio", image_file)])
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG not really")
    with pytest.raises(MediaError, match="image could not be decoded"):
        media_hidden_states(model, PROMPT, [("image", broken)])
    with pytest.raises(ValueError, match="placeholder"):
        media_hidden_states(model, f"look {IMAGE_TOKEN}", [("image", image_file)])
    # Qwen-VL fits media to a grid no flatter than 200:1; a file past that is the caller's error.
    from PIL import Image

    Image.new("RGB", (4000, 16)).save(tmp_path / "thin.png")
    thin_video = write_clip(tmp_path / "thin.mp4", gradients(2, 16, 4000))
    for kind, path in (("image", tmp_path / "thin.png"), ("video", thin_video)):
        with pytest.raises(MediaError, match="aspect ratio"):
            media_hidden_states(model, PROMPT, [(kind, path)])


def test_multimodal_flag_on_a_text_base_is_refused(tiny_model, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_model("qwen3_5", "pointer"), run)
    meta = read_meta(run).to_dict() | {"multimodal": True}
    torch.save(meta, run / "head.pt")
    with pytest.raises(ModelLoadError, match="says multimodal"):
        load_model(str(run))


def test_cli_builds_a_multimodal_model(tmp_path):
    runner = CliRunner()
    out = tmp_path / "m"
    result = runner.invoke(app, ["tiny-model", str(out), "--arch", "qwen3_5", "--readout", "lm_token",
                                 "--multimodal"])
    assert result.exit_code == 0, result.output
    assert "multimodal" in result.output
    assert read_meta(out).multimodal
    assert json.loads((out / "base" / "config.json").read_text())["model_type"] == "qwen3_5"
    assert load_model(str(out), media=True).media_types == ("image", "video")    # with or without torchvision
    refused = runner.invoke(app, ["tiny-model", str(tmp_path / "n"), "--arch", "qwen3", "--multimodal"])
    assert refused.exit_code == 2 and not (tmp_path / "n").exists()


def test_a_plain_multimodal_directory_loads_its_language_model_alone_unless_media_is_asked_for(built, loaded):
    text_only = load_model(str(built["choice"]))
    assert not text_only.multimodal and text_only.media_types == ()
    assert not any("visual" in name for name, _ in text_only.causal_lm.named_parameters())
    whole = loaded["choice"]
    assert whole.multimodal and "image" in whole.media_types
    assert any("visual" in name for name, _ in whole.causal_lm.named_parameters())


def test_the_engine_checks_media_in_jevanys_order_and_never_drops_it(loaded):
    from jevany_client.errors import InvalidRequestError, UnsupportedMediaError
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine

    engine = Engine(loaded["choice"], EngineConfig())
    body = {"state": "s", "questions": {"q": {"type": "noul"}}, "media": [{"type": "image", "uri": "/m/a.png"}]}
    if "video" not in loaded["choice"].media_types:
        with pytest.raises(UnsupportedMediaError, match=r"^checkpoint does not support the requested media type \(video"):
            engine.admit({**body, "media": [{"type": "video", "uri": "/m/v.mp4"}]})
    with pytest.raises(InvalidRequestError, match=r"media requests support at most 1 question\(s\)"):
        engine.admit({**body, "questions": {"a": {"type": "noul"}, "b": {"type": "noul"}}})
    # JevAny's one question is the most a media request may ask, not one past it: exactly one is admitted.
    admitted = engine.admit(body)
    assert [q.qid for q in admitted.request.questions] == ["q"] and admitted.request.media
    assert engine.decide({"state": "s", "questions": {"q": {"type": "noul"}}})["answers"]["q"]["type"] == "noul"


@pytest.mark.parametrize("readout", ["choice", "pointer"])
@pytest.mark.parametrize("kind", ["image", "video"])
def test_a_media_request_is_scored_alone_through_the_vision_tower(loaded, image_file, video_file, kind, readout,
                                                                  tmp_path):
    from PIL import Image

    from jevany_client.errors import InvalidRequestError
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine

    engine = Engine(loaded[readout], EngineConfig(max_batch_size=8))
    question = {"q": {"type": "choice", "criteria": {"cat": None, "dog": None, "bird": None}}}
    text = {"state": "what is in the picture?", "questions": question}
    if kind == "image":
        media, other = image_file, tmp_path / "other.png"
        Image.new("RGB", (64, 64), color=(250, 250, 0)).save(other)
    else:
        # the same length, rate and size as video_file, so only the pixels differ
        media, other = video_file, write_clip(tmp_path / "other.mp4", gradients(8, 32, 32), fps=4)
    with_media = {**text, "media": [{"type": kind, "uri": str(media)}]}
    bodies = [text, with_media, {**text, "media": [{"type": kind, "uri": str(other)}]}, text]
    results = engine.score([engine.admit(body) for body in bodies])
    plain, seen, seen_other, plain_again = (r["answers"]["q"]["probabilities"] for r in results)
    assert all(abs(plain[k] - plain_again[k]) <= 1e-5 for k in plain)   # text batches as before
    for p in (seen, seen_other):
        assert abs(sum(p.values()) - 1) < 1e-5 and all(0 <= v <= 1 for v in p.values())
    assert seen != plain and seen != seen_other          # the pixels reached the readout
    assert results[1]["batch"]["size"] == 1              # scored alone
    assert engine.decide(with_media)["answers"]["q"]["probabilities"] == seen   # and the same again
    with pytest.raises(InvalidRequestError, match="could not be validated"):
        broken = tmp_path / f"broken{media.suffix}"
        broken.write_bytes(b"not a media file")
        engine.decide({**text, "media": [{"type": kind, "uri": str(broken)}]})


def test_a_plain_directory_with_a_video_preprocessor_config_serves_video_by_its_settings(built, tmp_path,
                                                                                          video_file):
    # The layout of a Qwen3.5 checkpoint: preprocessor_config.json and video_preprocessor_config.json,
    # no nested processor_config.json. Its fps is doubled here, so all 8 frames are sampled.
    import shutil

    plain = shutil.copytree(built["choice"], tmp_path / "plain")
    nested = json.loads((plain / "processor_config.json").read_text())
    (plain / "processor_config.json").unlink()
    (plain / "preprocessor_config.json").write_text(json.dumps(nested["image_processor"]))
    (plain / "video_preprocessor_config.json").write_text(json.dumps(nested["video_processor"] | {"fps": 4}))
    model = load_model(str(plain), media=True)
    assert model.media_types == ("image", "video") and model.processor.video_processor.fps == 4
    out = media_hidden_states(model, PROMPT, [("video", video_file)])
    video_id = model.tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
    assert int((out.input_ids == video_id).sum()) == 8 // 2 * (32 // PATCH_SIZE) ** 2 // MERGE_SIZE ** 2
    assert torch.isfinite(out.hidden).all()


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                    reason="with torchvision, transformers' own video processor serves every setting")
@pytest.mark.parametrize("change, why", [({"resample": 2}, "bicubic"),
                                         ({"size": {"height": 32, "width": 32}}, "shortest_edge"),
                                         ({"video_processor_type": "Qwen2VLVideoProcessor"}, "Qwen2VLVideoProcessor")])
def test_video_settings_the_torch_only_processor_cannot_follow_leave_images_served(built, tmp_path, change, why):
    import shutil

    run = shutil.copytree(built["choice"], tmp_path / "run")
    config = json.loads((run / "processor_config.json").read_text())
    config["video_processor"] |= change
    (run / "processor_config.json").write_text(json.dumps(config))
    model = load_model(str(run), media=True)
    assert model.media_types == ("image",)
    assert why in model.info["media_unavailable"] and "torchvision" in model.info["media_unavailable"]
