"""Media on multimodal checkpoints: the processor that encodes it, and the one forward pass that reads it.

A multimodal checkpoint (Qwen3.5 with its vision tower) serves text-only
requests exactly like a text model: the engine runs DecisionModel.backbone,
the language model, on token ids. A request with media runs once through the
whole model instead (media_hidden_states): the processor turns each file into
pixel patches and a run of placeholder tokens, the vision tower encodes the
patches into those placeholders' embeddings, and the language model reads
the sequence with the model's own multimodal rotary positions. Where media
go follows JevAny (facts, "Media encoding"): every placeholder first, then
the prompt, one request with one question per pass.
"""
from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

MEDIA_TYPES = ("image", "video")
# Families whose processor marks media tokens with mm_token_type_ids and whose model
# takes image/video grids (Qwen-VL style); other configs with a vision tower load as text.
MULTIMODAL_MODEL_TYPES = ("qwen3_5",)
# Files that say a directory carries its own processor (rather than only a tokenizer).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
# What decodes each media type's files, beside the processor itself.
DECODERS = {"image": "PIL", "video": "av"}
DECODER_NAMES = {"image": "Pillow", "video": "PyAV"}


class MediaError(ValueError):
    """Media this model cannot read: an undecodable file, or a type it does not serve."""


def is_multimodal_config(config) -> bool:
    return getattr(config, "vision_config", None) is not None and config.model_type in MULTIMODAL_MODEL_TYPES


def has_processor(directory: str | Path) -> bool:
    return any((Path(directory) / name).is_file() for name in PROCESSOR_FILES)


def load_processor(location: str, tokenizer, revision: str | None = None):
    """The checkpoint's processor, rebuilt around the tokenizer the model already loaded.

    One tokenizer for text and media, so the escaping and token ids the engine
    relies on hold on both paths; the processor takes its placeholder ids from
    it. transformers' Qwen-VL video processor runs only on torchvision, and the
    processor will not even be built without it: a host without torchvision
    gets the processor's image half (Pillow's image processor) beside our
    torch-only twin of its video half (qwen_video.py), or, where the
    checkpoint's video settings are beyond that twin, images alone. Raises
    ImportError without Pillow.
    """
    from transformers import AutoImageProcessor, AutoProcessor

    if not _installed("PIL"):
        raise ImportError("media need Pillow (install the multimodal extra)")
    if not _installed("torchvision"):
        images = AutoImageProcessor.from_pretrained(location, revision=revision)
        videos, why = _torch_video_processor(location, revision)
        processor = _torchvision_free_processor()(images, tokenizer, videos, chat_template=tokenizer.chat_template)
        processor.video_unavailable = why
        return processor
    loaded = AutoProcessor.from_pretrained(location, revision=revision)
    parts = {name: getattr(loaded, name) for name in loaded.get_attributes()}
    return type(loaded)(**(parts | {"tokenizer": tokenizer}), chat_template=loaded.chat_template)


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _torch_video_processor(location: str, revision: str | None):
    """(the checkpoint's video processor on torch alone, None), or (None, why there is none)."""
    from . import qwen_video

    try:
        return qwen_video.load(location, revision), None
    except (qwen_video.UnsupportedVideoConfig, OSError) as exc:
        return None, f"{exc} (transformers' video processor needs torchvision)"


@functools.cache
def _torchvision_free_processor():
    from transformers import Qwen3VLProcessor

    from .qwen_video import processor_class

    torch_videos = processor_class()

    class Qwen3VLProcessorOnTorch(Qwen3VLProcessor):
        """Qwen3VLProcessor over our torch-only video processor, or over none (images only).

        transformers checks a video processor against its video base class,
        which it names only where torchvision is installed.
        """

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and (argument is None or isinstance(argument, torch_videos)):
                return torch_videos
            return super().check_argument_for_proper_class(argument_name, argument)

    return Qwen3VLProcessorOnTorch


def media_types(processor) -> tuple[str, ...]:
    """The media types this processor can encode here: its sub-processor and the file decoder both present."""
    return tuple(kind for kind in MEDIA_TYPES if not unavailable(processor, kind))


def unavailable(processor, kind: str) -> str | None:
    """Why this host cannot encode KIND with this processor, or None when it can."""
    if getattr(processor, f"{kind}_processor", None) is None:
        why = getattr(processor, f"{kind}_unavailable", None) or f"the processor has no {kind} processor"
        return f"{kind}: {why}"
    if not _installed(DECODERS[kind]):
        return f"{kind}: {DECODER_NAMES[kind]} is not installed"
    return None


@dataclass(frozen=True)
class MediaPass:
    hidden: torch.Tensor      # [1, L, d] final (normed) hidden states, as the text path's last_hidden_state
    input_ids: torch.Tensor   # [1, L]: the media placeholders, then the prompt
    prompt_start: int         # the prompt's token i sits at prompt_start + i


def media_hidden_states(model, prompt: str | Sequence[int], media: Sequence[tuple[str, str | Path]]) -> MediaPass:
    """One forward pass over MEDIA then PROMPT through the whole multimodal model; its final hidden states.

    The caller provides:
    - model: a DecisionModel loaded with multimodal=True and a processor;
    - prompt: what the engine would run for the request's one question, as
      token ids (prefix + branch of its Encoded: used as they are) or as text
      (tokenized here with model.tokenizer, no special tokens added). It must
      not hold media placeholder tokens: caller text is escaped beforehand;
    - media: (type, path) pairs, each type in model.media_types, each path a
      regular file already validated (inside the media root, within the caps).
    With no media it is the text path through the same modules.

    Positions are the model's own: text runs 0, 1, 2...; an image's tokens take
    (t, h, w) grid positions from where it starts, and the text after it
    continues past the grid's extent (Qwen's multimodal RoPE), so a readout
    position is prompt_start + its index in the prompt, never a position id.
    Runs under torch.inference_mode; the caller serializes forward passes.
    """
    prompt_ids = _prompt_ids(model, prompt)
    inputs = _media_inputs(model, media) if media else _no_media()
    ids = torch.cat([inputs.pop("input_ids"), prompt_ids], dim=1)
    kinds = torch.cat([inputs.pop("mm_token_type_ids"), torch.zeros_like(prompt_ids, dtype=torch.int32)], dim=1)
    prompt_start = ids.shape[1] - prompt_ids.shape[1]
    device = model.device
    base = model.causal_lm.base_model    # vision tower + language model, without the LM head
    try:
        with torch.inference_mode():
            out = base(input_ids=ids.to(device), attention_mask=torch.ones_like(ids, device=device),
                       mm_token_type_ids=kinds.to(device), use_cache=False,
                       **{k: v.to(device) for k, v in inputs.items()})
    finally:
        if hasattr(base, "rope_deltas"):
            base.rope_deltas = None      # generation state the pass leaves behind; a decision model keeps none
    return MediaPass(out.last_hidden_state, ids, prompt_start)


def _prompt_ids(model, prompt: str | Sequence[int]) -> torch.Tensor:
    if isinstance(prompt, str):
        prompt = model.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    if ids.shape[1] == 0:
        raise ValueError("the prompt is empty")
    config = model.config
    placeholders = [getattr(config, name, None) for name in ("image_token_id", "video_token_id")]
    if any(t is not None and bool((ids == t).any()) for t in placeholders):
        raise ValueError("the prompt holds media placeholder tokens; escape caller text before encoding it")
    return ids


def _no_media() -> dict:
    empty = torch.zeros((1, 0), dtype=torch.long)
    return {"input_ids": empty, "mm_token_type_ids": empty.to(torch.int32)}


def _media_inputs(model, media: Sequence[tuple[str, str | Path]]) -> dict:
    """The processor's encoding of the media alone: placeholder ids, their token types, pixels and grids."""
    processor = model.processor
    served = getattr(model, "media_types", ())
    for kind, _ in media:
        if kind not in served:
            raise MediaError(f"media type {kind!r} is not supported by this model; it serves {list(served)}")
    images = [read_image(path) for kind, path in media if kind == "image"]
    videos = [read_video(processor.video_processor, path) for kind, path in media if kind == "video"]
    text = "".join(_placeholder(processor, kind) for kind, _ in media)
    kwargs = {}
    if videos:
        kwargs = dict(videos=[v for v, _ in videos], video_metadata=[m for _, m in videos], do_sample_frames=False)
    try:
        encoded = processor(text=[text], images=images or None, return_tensors="pt", **kwargs)
    except ValueError as exc:
        # Qwen-VL's resize refuses what it cannot fit to a grid (an aspect ratio past 200): the file's fault.
        raise MediaError(f"media could not be encoded: {exc}") from exc
    encoded.pop("attention_mask", None)
    return dict(encoded)


def _placeholder(processor, kind: str) -> str:
    # What the chat template writes for a media part; the processor expands the pad token.
    token = processor.image_token if kind == "image" else processor.video_token
    return f"{processor.vision_start_token}{token}{processor.vision_end_token}"


def read_image(path: str | Path):
    """The image as RGB, decoded with Pillow (whole, then the file is closed)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except Exception as exc:
        raise MediaError(f"image could not be decoded: {exc}") from exc


def read_video(video_processor, path: str | Path):
    """(frames [T, H, W, 3] uint8, metadata): the frames the processor samples, decoded with PyAV.

    Decodes up to the last sampled frame and keeps only the sampled ones, so a
    long video costs its sampled frames' memory, not its whole length.
    """
    import av
    import numpy as np
    from transformers.video_utils import VideoMetadata

    from jevany_daemon.media.frames import frames_as_declared

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            fps = float(stream.average_rate or 0) or None
            total = int(stream.frames)
            metadata = VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps if fps else None,
                                     width=stream.width, height=stream.height, video_backend="pyav")
            indices = _frame_indices(video_processor, metadata)
            wanted, frames = set(indices), {}
            # Only frames of the size the checked header declared (media/frames.py): a bigger
            # one is refused as the file's fault before it costs more than its own decode.
            for i, frame in frames_as_declared(container, stream, indices[-1]):
                if i in wanted:
                    frames[i] = frame.to_ndarray(format="rgb24")
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError(f"video could not be decoded: {exc}") from exc
    if len(frames) != len(wanted):
        raise MediaError(f"video has fewer frames than the {total} its header declares")
    metadata.frames_indices = indices
    return np.stack([frames[i] for i in indices]), metadata


def _frame_indices(video_processor, metadata) -> list[int]:
    if metadata.total_num_frames <= 0:
        raise MediaError("video frame count is unavailable")
    indices = [int(i) for i in video_processor.sample_frames(metadata)]
    # The vision tower takes frames in pairs (temporal patches): a one-frame video repeats it.
    short = -len(indices) % video_processor.temporal_patch_size
    return indices + indices[-1:] * short
