"""A tiny Qwen2.5-VL model, character tokenizer and image processor, built locally
in Hugging Face format.

The vision counterpart of `models/tiny_model.py`, for the same reason: nothing may
be downloaded, yet every role must load the model through the calls that load
Qwen/Qwen2.5-VL-3B-Instruct on a GPU node (`AutoModelForImageTextToText`,
`AutoTokenizer`, `AutoImageProcessor` on a directory). Small patches (4 px) and a
small pixel budget keep an image to a few dozen patches, so CPU PPO runs stay fast.
"""

from __future__ import annotations

from pathlib import Path

from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from configs.schema import TinyModelSpec
from data.vision_packer import IMAGE_TOKEN, VIDEO_TOKEN, VISION_END, VISION_START
from models.tiny_model import build_once, build_tokenizer, seeded_model, text_model_kwargs
from models.tiny_spec import write_tiny_spec

VISION_TOKENS = [VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN]

# ChatML as Qwen2.5-VL renders it: each image or video part becomes one placeholder
# between vision markers, which the DataPacker expands to the part's patch count.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] in ('video', 'video_url') %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPATIAL_MERGE_SIZE = 2  # Qwen2.5-VL's own values: the processor and the model must agree
TEMPORAL_PATCH_SIZE = 2


def mrope_section(head_dim: int) -> list[int]:
    """Split each head's rotary half into temporal, height and width sections in
    Qwen2.5-VL's proportions (head_dim 128 -> [16, 24, 24])."""
    half = head_dim // 2
    temporal = max(1, half // 4)
    height = (half - temporal) // 2
    return [half - 2 * height, height, height]


def build_tiny_vlm(path: str | Path, spec: TinyModelSpec) -> Path:
    """Write the tiny VLM, tokenizer and image processor to `path` (once, atomically:
    `models.tiny_model.build_once`)."""
    if spec.vision is None:
        raise ValueError("model.tiny.vision is not set: the tiny model is text-only (models/tiny_model.py)")
    return build_once(path, lambda staging: (_write(staging, spec), write_tiny_spec(staging, spec)))


def _write(directory: Path, spec: TinyModelSpec) -> None:
    vision = spec.vision
    assert vision is not None
    tokenizer = build_tokenizer(spec.task_alphabet)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    token_id = tokenizer.convert_tokens_to_ids
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size,
        merge_size=SPATIAL_MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        min_pixels=vision.min_pixels,
        max_pixels=vision.max_pixels,
    )
    head_dim = spec.hidden_size // spec.num_attention_heads
    config = Qwen2_5_VLConfig(
        text_config=dict(
            **text_model_kwargs(spec, tokenizer),
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope_section(head_dim)},
        ),
        vision_config=dict(
            depth=vision.depth,
            hidden_size=vision.hidden_size,
            intermediate_size=2 * vision.hidden_size,
            num_heads=vision.num_heads,
            patch_size=vision.patch_size,
            spatial_merge_size=SPATIAL_MERGE_SIZE,
            temporal_patch_size=TEMPORAL_PATCH_SIZE,
            window_size=vision.patch_size * SPATIAL_MERGE_SIZE * 4,
            fullatt_block_indexes=[vision.depth - 1],
            out_hidden_size=spec.hidden_size,
            tokens_per_second=vision.tokens_per_second,
        ),
        image_token_id=token_id(IMAGE_TOKEN),
        video_token_id=token_id(VIDEO_TOKEN),
        vision_start_token_id=token_id(VISION_START),
        vision_end_token_id=token_id(VISION_END),
        tie_word_embeddings=True,
    )
    model = seeded_model(Qwen2_5_VLForConditionalGeneration, config, spec.seed, tokenizer)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    image_processor.save_pretrained(directory)
