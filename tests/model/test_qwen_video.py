"""Our torch-only Qwen3-VL video processor: its grids and patch layout everywhere, and, where
torchvision lets transformers' own processor run, the same pixels bit for bit."""
import numpy as np
import pytest
import torch

pytest.importorskip("PIL", reason="the multimodal processor needs Pillow")

from jevany_daemon.model.multimodal import read_video  # noqa: E402
from jevany_daemon.model.qwen_video import processor_class, resize_bicubic  # noqa: E402
from jevany_daemon.model.tiny_vision import build_processors  # noqa: E402
from tests.media.clips import gradients, write_clip  # noqa: E402


def _torchvision_error() -> str | None:
    try:
        import torchvision  # noqa: F401
    except Exception as exc:    # noqa: BLE001 - PyPI's torchvision fails to import beside a torch it was not built for
        return f"{type(exc).__name__}: {exc}"
    return None


needs_torchvision = pytest.mark.skipif(
    _torchvision_error() is not None,
    reason=f"transformers' video processor, the reference, runs only on torchvision ({_torchvision_error()})")

_TINY = {k: v for k, v in build_processors()[1].to_dict().items() if k != "video_processor_type"}
CONFIGS = {
    "tiny": _TINY,
    # Qwen3-VL's per-frame cap, tight enough to bind on most shapes below
    "tiny-capped": _TINY | {"cap_pixels_per_frame": True, "max_video_tokens": 6},
    # a real checkpoint's scale: 16-pixel patches and transformers' default pixel budget
    "qwen3.5": {"patch_size": 16, "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "cap_pixels_per_frame": True},
}
# (frames, height, width): on the grid, odd frame counts, upscales, tiny frames below the
# patch factor, extreme aspect ratios, and frames the pixel budget shrinks.
SHAPES = [(2, 32, 32), (3, 20, 50), (5, 64, 48), (8, 200, 120), (4, 7, 9), (2, 300, 30), (6, 33, 97),
          (16, 240, 320)]


def processors(config: str):
    """(ours, transformers') built from the same settings; transformers' runs its arithmetic anywhere."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return processor_class()(**CONFIGS[config]), Qwen3VLVideoProcessor(**CONFIGS[config])


def run(processor, frames: np.ndarray):
    return processor([frames], do_sample_frames=False, return_tensors="pt")


@pytest.mark.parametrize("config", CONFIGS)
def test_grids_agree_with_transformers_token_arithmetic(config):
    ours, theirs = processors(config)
    for t, h, w in SHAPES:
        out = run(ours, gradients(t, h, w))
        (grid,) = out["video_grid_thw"].tolist()
        patches = theirs.get_num_of_video_patches(t, h, w)
        assert grid[0] * grid[1] * grid[2] == patches == out["pixel_values_videos"].shape[0], (t, h, w)
        assert grid[0] == -(-t // ours.temporal_patch_size)
        assert grid[1] % ours.merge_size == 0 and grid[2] % ours.merge_size == 0
        assert out["pixel_values_videos"].shape[1] == 3 * ours.temporal_patch_size * ours.patch_size ** 2


def test_patches_are_laid_out_as_the_vision_tower_reads_them():
    # 3 frames of 32 x 48 sit on the tiny grid (16-pixel merged patches) within its pixel
    # bounds, so nothing is resized; the odd frame count pads with the last frame.
    ours, _ = processors("tiny")
    frames = gradients(3, 32, 48)
    out = run(ours, frames)
    p, m, tp = ours.patch_size, ours.merge_size, ours.temporal_patch_size
    assert out["video_grid_thw"].tolist() == [[2, 32 // p, 48 // p]]
    normed = (np.concatenate([frames, frames[-1:]]).astype(np.float64) / 255 - 0.5) / 0.5   # [T, H, W, C]
    rows = []
    for t in range(0, 4, tp):                              # temporal patch, then merge block, then patch in block
        for block_y in range(32 // p // m):
            for block_x in range(48 // p // m):
                for y in range(m):
                    for x in range(m):
                        top, left = (block_y * m + y) * p, (block_x * m + x) * p
                        patch = normed[t:t + tp, top:top + p, left:left + p]      # [tp, p, p, C]
                        rows.append(patch.transpose(3, 0, 1, 2).reshape(-1))       # channel, time, row, column
    expected = torch.tensor(np.stack(rows), dtype=torch.float32)
    assert torch.allclose(out["pixel_values_videos"], expected, atol=1e-6, rtol=0)


def test_a_still_video_is_laid_out_as_its_image():
    # The image processor repeats an image into one temporal patch; a two-frame still video
    # of that image, unresized by either, gives the same patches.
    from PIL import Image

    images = build_processors()[0]
    ours, _ = processors("tiny")
    frame = gradients(1, 32, 48)[0]
    image = images([Image.fromarray(frame)], return_tensors="pt")
    video = run(ours, np.stack([frame, frame]))
    assert video["video_grid_thw"].tolist() == image["image_grid_thw"].tolist() == [[1, 4, 6]]
    assert torch.allclose(video["pixel_values_videos"], image["pixel_values"], atol=1e-6, rtol=0)


def test_a_video_shorter_than_a_temporal_patch_is_refused_as_transformers_refuses_it(tmp_path):
    ours, _ = processors("tiny")
    with pytest.raises(ValueError, match="temporal_factor"):
        run(ours, gradients(1, 32, 32))
    # read_video repeats a lone frame, so a one-frame file still makes one temporal patch
    frames, metadata = read_video(ours, write_clip(tmp_path / "one.mp4", gradients(1, 32, 32)))
    assert metadata.frames_indices == [0, 0]
    assert run(ours, frames)["video_grid_thw"].tolist() == [[1, 32 // ours.patch_size, 32 // ours.patch_size]]


def test_the_checkpoints_settings_are_honoured():
    # fps, min/max frames choose the frames; size, patch and merge sizes the grid; mean/std the values
    ours = processor_class()(**_TINY | {"fps": 1, "max_frames": 3, "patch_size": 4, "image_mean": [0.0] * 3,
                                        "image_std": [1.0] * 3})
    from transformers.video_utils import VideoMetadata

    indices = ours.sample_frames(VideoMetadata(total_num_frames=40, fps=4.0, duration=10.0))
    assert list(indices) == [0, 20, 39]
    out = run(ours, gradients(2, 32, 48))
    assert out["video_grid_thw"].tolist() == [[1, 32 // 4, 48 // 4]]
    assert out["pixel_values_videos"].shape[1] == 3 * 2 * 4 * 4
    assert 0 <= float(out["pixel_values_videos"].min()) and float(out["pixel_values_videos"].max()) <= 1


def test_a_resize_to_the_same_size_leaves_frames_alone_and_keeps_their_type():
    frames = torch.from_numpy(gradients(2, 32, 48)).permute(0, 3, 1, 2)
    assert resize_bicubic(frames, 32, 48) is frames
    smaller = resize_bicubic(frames, 16, 24)
    assert smaller.shape == (2, 3, 16, 24) and smaller.dtype == torch.uint8
    flat = torch.full((2, 3, 30, 30), 200, dtype=torch.uint8)
    assert bool((resize_bicubic(flat, 64, 16) == 200).all())      # the kernel's weights sum to one


@needs_torchvision
@pytest.mark.parametrize("config", CONFIGS)
def test_pixels_match_transformers_bit_for_bit(config):
    ours, theirs = processors(config)
    for seed, (t, h, w) in enumerate(SHAPES):
        frames = gradients(t, h, w, seed=seed)
        mine, reference = run(ours, frames), run(theirs, frames)
        assert torch.equal(mine["video_grid_thw"], reference["video_grid_thw"]), (t, h, w)
        delta = (mine["pixel_values_videos"] - reference["pixel_values_videos"]).abs().max().item()
        assert delta == 0.0, f"{(t, h, w)}: max |delta| {delta}"
    with pytest.raises(ValueError, match="temporal_factor"):
        run(theirs, gradients(1, 32, 32))


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.int16, torch.float32])
def test_resizes_of_other_types_match_torchvision(dtype):
    # torchvision resizes uint8 natively on a CPU and casts other integer types to float and back:
    # the branch a uint8 video takes off the CPU.
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as tvF

    frames = torch.from_numpy(gradients(3, 37, 53)).permute(0, 3, 1, 2).to(dtype) * 3
    for height, width in [(16, 32), (80, 96), (37, 20)]:
        expected = tvF.resize(frames, [height, width], interpolation=InterpolationMode.BICUBIC, antialias=True)
        assert torch.equal(resize_bicubic(frames, height, width), expected), (dtype, height, width)


@needs_torchvision
def test_decoded_clips_and_their_placeholders_match_transformers(tmp_path):
    # The whole processor, transformers' against ours, on files decoded as the worker decodes
    # them: one frame, an odd number of sampled frames, and a clip sampled down.
    from transformers import AutoProcessor

    from jevany_daemon.model.multimodal import _placeholder, _torchvision_free_processor
    from jevany_daemon.model.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "mm", arch="qwen3_5", readout="choice", multimodal=True)
    theirs = AutoProcessor.from_pretrained(model)
    parts = {name: getattr(theirs, name) for name in ("image_processor", "tokenizer")}
    ours = _torchvision_free_processor()(**parts, video_processor=processor_class().from_pretrained(model),
                                         chat_template=theirs.chat_template)
    for name, (frames, height, width, fps) in {"one": (1, 32, 32, 4), "odd": (6, 40, 64, 4), "long": (30, 96, 64, 10)}.items():
        path = write_clip(tmp_path / f"{name}.mp4", gradients(frames, height, width), fps=fps)
        decoded = [read_video(p.video_processor, path) for p in (ours, theirs)]
        assert np.array_equal(decoded[0][0], decoded[1][0])
        encoded = [p(text=[_placeholder(p, "video")], videos=[v], video_metadata=[m], do_sample_frames=False,
                     return_tensors="pt") for p, (v, m) in zip((ours, theirs), decoded)]
        assert encoded[0].keys() == encoded[1].keys()
        for key in encoded[1]:
            assert torch.equal(encoded[0][key], encoded[1][key]), (name, key)
