"""The vision half of the tiny multimodal model: a Qwen3.5 vision tower and its Qwen-VL processor.

Sized so that an image costs at most 16 placeholder tokens and a forward pass
on a CPU takes milliseconds: 8-pixel patches merged 2 x 2, images of 32 x 32
to 64 x 64 pixels, videos sampled at 2 frames a second, 2 to 8 frames.
The processor is transformers' own (Qwen3VLProcessor over a Qwen2-VL image
processor and a Qwen3-VL video processor, as real Qwen3.5 checkpoints ship),
so the media path under test is the one a real checkpoint takes, with or
without torchvision. Nothing is downloaded.
"""
from __future__ import annotations

from pathlib import Path

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_TOKEN, VIDEO_TOKEN = "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN)

PATCH_SIZE = 8
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
IMAGE_PIXELS = {"shortest_edge": 32 * 32, "longest_edge": 64 * 64}
VIDEO_PIXELS = {"shortest_edge": 32 * 32 * 2, "longest_edge": 64 * 64 * 8}
VIDEO_FPS, MIN_FRAMES, MAX_FRAMES = 2, 2, 8
# Qwen3.5's normalization (its preprocessor_config.json), not CLIP's.
MEAN = STD = [0.5, 0.5, 0.5]

_VISION_SHAPE = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, in_channels=3,
                     patch_size=PATCH_SIZE, spatial_merge_size=MERGE_SIZE,
                     temporal_patch_size=TEMPORAL_PATCH_SIZE, num_position_embeddings=64)

# Qwen3.5's chat template, cut to what the tiny model needs: a message's content is a
# string (exactly the text template's output) or a list of parts, where an image or a
# video part becomes its placeholder, which the processor expands to one token per
# merged patch. enable_thinking is accepted and ignored.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{- '" + VISION_START + IMAGE_TOKEN + VISION_END + "' }}"
    "{%- elif part['type'] == 'video' %}{{- '" + VISION_START + VIDEO_TOKEN + VISION_END + "' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def mrope_section(rotary_half: int) -> list[int]:
    """Qwen3.5's (temporal, height, width) split of the rotary frequencies, [11, 11, 10] of 32, scaled."""
    spatial = round(rotary_half * 11 / 32)
    return [spatial, spatial, rotary_half - 2 * spatial]


def multimodal_config(text_config, tokenizer):
    """A Qwen3_5Config: the given text config with multimodal rotary positions, plus a tiny vision tower."""
    from transformers import Qwen3_5Config, Qwen3_5VisionConfig

    text = text_config.to_dict()
    partial = text.get("partial_rotary_factor") or text["rope_parameters"].get("partial_rotary_factor", 0.25)
    rotary_half = int(text["head_dim"] * partial) // 2
    text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": mrope_section(rotary_half),
                               "mrope_interleaved": True}
    vision = Qwen3_5VisionConfig(**_VISION_SHAPE, out_hidden_size=text["hidden_size"])
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("vision_start_token_id", VISION_START), ("vision_end_token_id", VISION_END),
        ("image_token_id", IMAGE_TOKEN), ("video_token_id", VIDEO_TOKEN))}
    return Qwen3_5Config(text_config=text, vision_config=vision.to_dict(), tie_word_embeddings=False, **ids)


def build_processors():
    """(image processor, video processor) of the tiny model, Qwen-VL style, from transformers.

    The image processor is the Pillow one (no torchvision needed); the video
    processor is transformers' only one for Qwen-VL, which needs torchvision
    to run but not to be built and saved (where torchvision is missing, its
    saved settings load into qwen_video.py's torch-only twin).
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    common = dict(patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE,
                  image_mean=MEAN, image_std=STD)
    images = Qwen2VLImageProcessorPil(size=dict(IMAGE_PIXELS), **common)
    videos = Qwen3VLVideoProcessor(size=dict(VIDEO_PIXELS), fps=VIDEO_FPS, min_frames=MIN_FRAMES,
                                   max_frames=MAX_FRAMES, cap_pixels_per_frame=False, **common)
    return images, videos


def save_processor(directory: Path, tokenizer) -> None:
    """Write the Qwen3VLProcessor files (processor_config.json, tokenizer, chat template) into DIRECTORY.

    Written from its parts, in the layout Qwen3VLProcessor.save_pretrained
    writes, because the processor itself cannot be constructed where
    torchvision is missing (it type-checks its video processor against
    transformers' torchvision-only registry); loading copes (multimodal.py
    builds it over the torch-only video processor).
    """
    import json

    images, videos = build_processors()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer._set_processor_class("Qwen3VLProcessor")     # as the processor's save records it
    tokenizer.save_pretrained(directory)
    config = {"image_processor": images.to_dict(), "processor_class": "Qwen3VLProcessor",
              "video_processor": videos.to_dict()}
    (Path(directory) / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
