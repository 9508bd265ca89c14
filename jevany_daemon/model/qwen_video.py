"""Qwen3-VL's video preprocessing with its pixel work in plain torch, for hosts without torchvision.

transformers' Qwen3VLVideoProcessor resizes and normalizes frames through
torchvision, and a CPU install may have none (PyPI's torchvision wheels pin
one exact torch release). TorchVideoProcessor is that processor with only
the torchvision calls replaced: the checkpoint's config and its defaults,
frame sampling, the grid (smart_resize), patchify and the token arithmetic
are inherited, so the two can differ only where torchvision would have run.
Each replacement does what torchvision's v2 kernel does, operation for
operation (torchvision 0.29, transforms/v2/functional): tests/model/
test_qwen_video.py compares the two processors bit for bit wherever
torchvision is installed.
"""
from __future__ import annotations

import functools

import torch
from torch.nn.functional import interpolate

BICUBIC = 3   # PIL's Image.Resampling.BICUBIC, what Qwen-VL checkpoints ask for


class UnsupportedVideoConfig(ValueError):
    """A video processor config this module cannot reproduce without torchvision."""


def check_resample(resample) -> None:
    # Only bicubic is reproduced: torchvision's other modes take other kernels (and, for
    # uint8 bilinear, a CPU-capability-dependent one).
    if getattr(resample, "value", resample) not in (BICUBIC, "bicubic"):
        raise UnsupportedVideoConfig(f"video resampling {resample!r} needs torchvision; bicubic does not")


def check_size(size) -> None:
    if not size or not size.shortest_edge or not size.longest_edge:
        raise UnsupportedVideoConfig(f"video size needs shortest_edge and longest_edge, got {size}")


def resize_bicubic(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """FRAMES [..., C, H, W] resized to HEIGHT x WIDTH as torchvision's resize(BICUBIC, antialias=True) does.

    torchvision leaves a frame of the target size untouched, resizes uint8 on
    the CPU with torch's own uint8 kernel (which differs from a float resize,
    rounded, by up to tens of levels), and elsewhere resizes in float32, then
    clamps, rounds and casts back.
    """
    *lead, channels, old_height, old_width = frames.shape
    if (height, width) == (old_height, old_width) or frames.numel() == 0:
        return frames
    dtype = frames.dtype
    native = dtype in (torch.float32, torch.float64) or (dtype == torch.uint8 and frames.device.type == "cpu")
    flat = frames.reshape(-1, channels, old_height, old_width)
    if not native:
        flat = flat.to(torch.float32)
    out = interpolate(flat, size=[height, width], mode="bicubic", align_corners=False, antialias=True)
    if not native:
        if dtype == torch.uint8:
            out = out.clamp_(min=0, max=255)
        if not dtype.is_floating_point:
            out = out.round_()
        out = out.to(dtype)
    return out.reshape(*lead, channels, height, width)


def rescale_and_normalize(frames: torch.Tensor, do_rescale: bool, rescale_factor: float, do_normalize: bool,
                          mean, std) -> torch.Tensor:
    """transformers' fused rescale-then-normalize, in its float32 arithmetic (bit for bit)."""
    if do_rescale and do_normalize:
        # (x * f - m) / s computed as (x - m / f) / (s / f), the order transformers uses.
        mean = torch.tensor(mean, device=frames.device) * (1.0 / rescale_factor)
        std = torch.tensor(std, device=frames.device) * (1.0 / rescale_factor)
    if do_normalize:
        return _normalize(frames.to(torch.float32), mean, std)
    if do_rescale:
        return frames * rescale_factor
    return frames


def _normalize(frames: torch.Tensor, mean, std) -> torch.Tensor:
    mean = torch.as_tensor(mean, dtype=frames.dtype, device=frames.device)
    std = torch.as_tensor(std, dtype=frames.dtype, device=frames.device)
    if not bool(std.all()):
        raise UnsupportedVideoConfig("video normalization std holds a zero")
    if mean.ndim == 1:
        mean = mean.view(-1, 1, 1)
    if std.ndim == 1:
        std = std.view(-1, 1, 1)
    return frames.sub(mean).div_(std)


def frame_pixel_budget(processor, num_frames: int, size, factor: int, cap_pixels_per_frame: bool | None) -> int:
    """The most pixels the whole clip may keep after resizing: Qwen3-VL's cap_pixels_per_frame rule."""
    if not cap_pixels_per_frame:
        return size.longest_edge
    per_frame = max(min(processor.max_video_tokens * factor * factor, size.longest_edge // num_frames),
                    int(size.shortest_edge * 1.05))
    return per_frame * num_frames


@functools.cache
def processor_class():
    """TorchVideoProcessor, built on first use: importing transformers' processor costs a second."""
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import ChannelDimension
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor, smart_resize
    from transformers.video_utils import convert_to_rgb

    class TorchVideoProcessor(Qwen3VLVideoProcessor):
        """Qwen3VLVideoProcessor whose frames are converted, resized and normalized without torchvision."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            # Settings this processor cannot follow are refused now, at load, not per request.
            check_resample(self.resample)
            check_size(self.size)

        def convert_to_rgb(self, video: torch.Tensor) -> torch.Tensor:
            # torchvision's grayscale_to_rgb (one channel becomes three equal ones), then
            # transformers' own torch-only step (an alpha channel is blended onto white).
            if video.shape[-3] == 1:
                repeats = [1] * video.ndim
                repeats[-3] = 3
                video = video.repeat(repeats)
            return convert_to_rgb(video, input_data_format=ChannelDimension.FIRST)

        def _preprocess(self, videos: list[torch.Tensor], do_resize: bool, size, resample, do_rescale: bool,
                        rescale_factor: float, do_normalize: bool, image_mean, image_std, patch_size: int,
                        temporal_patch_size: int, merge_size: int, cap_pixels_per_frame: bool | None = None,
                        return_tensors=None, **kwargs):
            # One video at a time: transformers stacks same-shaped videos first, which changes
            # nothing per frame, since every step here works frame by frame.
            pixels, grids = [], []
            for video in videos:
                if do_resize:
                    video = self._resize(video, size, resample, patch_size * merge_size, temporal_patch_size,
                                         cap_pixels_per_frame)
                video = rescale_and_normalize(video, do_rescale, rescale_factor, do_normalize, image_mean,
                                              image_std)
                patches, grid_t, grid_h, grid_w = self.patchify(video[None], patch_size=patch_size,
                                                                merge_size=merge_size,
                                                                temporal_patch_size=temporal_patch_size)
                pixels.append(patches[0])
                grids.append([grid_t, grid_h, grid_w])
            return BatchFeature(data={"pixel_values_videos": torch.cat(pixels), "video_grid_thw": torch.tensor(grids)},
                                tensor_type=return_tensors)

        def _resize(self, video: torch.Tensor, size, resample, factor: int, temporal_factor: int,
                    cap_pixels_per_frame: bool | None) -> torch.Tensor:
            check_resample(resample)
            check_size(size)
            num_frames, _, height, width = video.shape
            budget = frame_pixel_budget(self, num_frames, size, factor, cap_pixels_per_frame)
            new_height, new_width = smart_resize(num_frames, height, width, temporal_factor=temporal_factor,
                                                 factor=factor, min_pixels=size.shortest_edge, max_pixels=budget)
            return resize_bicubic(video, new_height, new_width)

    return TorchVideoProcessor


def load(location: str, revision: str | None = None):
    """The checkpoint's Qwen3-VL video processor as a TorchVideoProcessor.

    Reads the config transformers would (processor_config.json's
    video_processor, else video_preprocessor_config.json, else
    preprocessor_config.json). Raises UnsupportedVideoConfig for a video
    processor of another family or settings this module cannot reproduce,
    OSError when the directory has no processor config at all.
    """
    cls = processor_class()
    config, _ = cls.get_video_processor_dict(location, revision=revision)
    kind = config.get("video_processor_type", "Qwen3VLVideoProcessor")
    if kind != "Qwen3VLVideoProcessor":
        raise UnsupportedVideoConfig(f"video processor {kind} needs torchvision")
    return cls.from_dict({k: v for k, v in config.items() if k != "video_processor_type"})
