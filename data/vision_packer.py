"""The Qwen2.5-VL DataPacker: conversations with images and videos to token ids,
pixel patches and grid sizes (S-RUN-6).

Built from the processor's parts, not `AutoProcessor`, which cannot be built without
torchvision (docs/howto/custom-datapacker.md, "The Qwen2.5-VL packer in detail").

Notation: b = batch, p = padded prompt length; T = temporal patch size, P =
patch size, m = spatial merge size, C = channels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from data.packer_media import PromptMediaError, VideoFrames, load_part_image, load_part_video, media_kind
from data.chat_render import render_all, render_prompt
from data.packing import (
    MultimodalInputs,
    PackedPrompts,
    as_conversation,
    decode_responses,
    load_chat_tokenizer,
    prompt_location,
)

IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"

DEFAULT_FPS = 2.0
"""Frames per second assumed for a frame list without `fps`, and the sampling rate of
a video file without one: Qwen2.5-VL's own default."""


class QwenVLPacker:
    """Packs Qwen2.5-VL prompts: text, images and videos in any order, any number per row.

    Per row, in the order the parts appear: images through the image processor
    (pixel_values (patches, C*T*P*P), image_grid_thw (images, 3)); videos through
    `video_patches` (pixel_values_videos, video_grid_thw, second_per_grid_ts). Then
    the chat template (with the generation prompt) renders one placeholder per part,
    each is expanded to its patch count, and the batch is tokenized left-padded.
    """

    def __init__(self, tokenizer, image_processor, *, default_fps: float = DEFAULT_FPS):
        if default_fps <= 0:
            raise ValueError(f"data_packer.factory_kwargs.default_fps must be positive (got {default_fps})")
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.default_fps = float(default_fps)
        self.image_token_id = self._token_id(IMAGE_TOKEN)
        self.video_token_id = self._token_id(VIDEO_TOKEN)
        self.never_generate = tuple(self._token_id(t) for t in (VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN))
        self.merge_size = int(image_processor.merge_size)
        self.patch_size = int(image_processor.patch_size)
        self.temporal_patch_size = int(image_processor.temporal_patch_size)

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or (token_id == self.tokenizer.unk_token_id and token != self.tokenizer.unk_token):
            raise ValueError(f"the tokenizer has no {token} token, which Qwen-VL prompts need")
        return int(token_id)

    def pack_prompts(self, prompts: Sequence[Any], sources: Sequence[str] | None = None) -> PackedPrompts:
        texts: list[str] = []
        per_sample: list[dict[str, torch.Tensor]] = []
        for index, prompt in enumerate(prompts):
            where = prompt_location(sources, index)
            conversation = as_conversation(prompt)
            images, videos = self._open_media(conversation, where)
            tensors: dict[str, torch.Tensor] = {}
            image_counts: list[int] = []
            video_counts: list[int] = []
            if images:
                processed = self.image_processor(images=images, return_tensors="pt")
                tensors["pixel_values"] = processed["pixel_values"]
                tensors["image_grid_thw"] = processed["image_grid_thw"]
                image_counts = self._placeholder_counts(processed["image_grid_thw"])
            if videos:
                patches = [self.video_patches(video) for video in videos]
                tensors["pixel_values_videos"] = torch.cat([p[0] for p in patches])
                tensors["video_grid_thw"] = torch.cat([p[1] for p in patches])
                tensors["second_per_grid_ts"] = torch.tensor(
                    [self.temporal_patch_size / video.fps for video in videos], dtype=torch.float32
                )
                video_counts = self._placeholder_counts(tensors["video_grid_thw"])
            (text,) = render_all(  # S-BYO-4: a template's refusal names the row and repeats on rerun
                lambda turns: render_prompt(self.tokenizer, turns), [conversation], [where],
                template="the model's chat template",
            )
            text = _expand(text, IMAGE_TOKEN, image_counts, where)
            text = _expand(text, VIDEO_TOKEN, video_counts, where)
            texts.append(text)
            per_sample.append(tensors)
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        input_ids = encoded["input_ids"]
        token_types = torch.zeros_like(input_ids)
        token_types[input_ids == self.image_token_id] = 1
        token_types[input_ids == self.video_token_id] = 2
        return PackedPrompts(
            input_ids,
            encoded["attention_mask"],
            multimodal=MultimodalInputs(token_types, tuple(per_sample), never_generate=self.never_generate),
        )

    def decode_completions(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return decode_responses(self.tokenizer, response_ids, response_mask)

    def _open_media(self, conversation: list[dict], where: str) -> tuple[list[Image.Image], list[VideoFrames]]:
        images: list[Image.Image] = []
        videos: list[VideoFrames] = []
        for m, message in enumerate(conversation):
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for p, part in enumerate(content):
                kind = media_kind(part)
                path = f"prompt[{m}].content[{p}]"
                if kind == "image":
                    images.append(load_part_image(part, path, where))
                elif kind == "video":
                    videos.append(load_part_video(part, path, where, self.default_fps))
        return images, videos

    def _placeholder_counts(self, grid_thw: torch.Tensor) -> list[int]:
        return (grid_thw.prod(dim=-1) // self.merge_size**2).tolist()

    def video_patches(self, video: VideoFrames) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames to (pixel_values_videos (t*h*w, C*T*P*P), video_grid_thw (1, 3)).

        Every frame is resized to the size the image processor's rule gives the first
        one (dimensions multiples of P*m, pixel count within the processor's
        min/max), rescaled and normalized like an image; the frame count is padded
        to a multiple of T by repeating the last frame, as transformers does.
        """
        processor = self.image_processor
        size = processor.size
        min_pixels = _size_value(size, "shortest_edge", "min_pixels")
        max_pixels = _size_value(size, "longest_edge", "max_pixels")
        first = video.frames[0]
        height, width = smart_resize(
            first.height, first.width, self.patch_size * self.merge_size, min_pixels, max_pixels
        )
        mean = np.asarray(processor.image_mean, dtype=np.float32).reshape(1, 1, -1)
        std = np.asarray(processor.image_std, dtype=np.float32).reshape(1, 1, -1)
        arrays = []
        for frame in video.frames:
            resized = frame.resize((width, height), Image.Resampling.BICUBIC)
            pixels = np.asarray(resized, dtype=np.float32) * float(processor.rescale_factor)
            arrays.append(((pixels - mean) / std).transpose(2, 0, 1))  # (C, H, W)
        frames = np.stack(arrays)  # (F, C, H, W)
        if pad := -len(frames) % self.temporal_patch_size:
            frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
        patches, grid = patchify_video(frames, self.patch_size, self.merge_size, self.temporal_patch_size)
        return torch.from_numpy(patches), torch.tensor([grid], dtype=torch.int64)


def patchify_video(
    frames: np.ndarray, patch_size: int, merge_size: int, temporal_patch_size: int
) -> tuple[np.ndarray, list[int]]:
    """(F, C, H, W) with F a multiple of T -> (t*h*w, C*T*P*P) patches and [t, h, w].

    Rows are ordered (t, h/m, w/m, m, m) and each row is (C, T, P, P): the layout of
    transformers' `Qwen2VLVideoProcessor.patchify`, which the vision tower's patch
    embedding and window attention expect.
    """
    num_frames, channels, height, width = frames.shape
    grid_t = num_frames // temporal_patch_size
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = frames.reshape(
        grid_t, temporal_patch_size, channels,
        grid_h // merge_size, merge_size, patch_size,
        grid_w // merge_size, merge_size, patch_size,
    )
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(grid_t * grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)
    return np.ascontiguousarray(flat, dtype=np.float32), [grid_t, grid_h, grid_w]


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen2-VL resize rule (dimensions multiples of `factor`, area within
    [min_pixels, max_pixels], aspect ratio kept), imported so frames and images agree."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as qwen_smart_resize

    return qwen_smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def _size_value(size: Any, key: str, legacy_key: str) -> int:
    for name in (key, legacy_key):
        value = size.get(name) if isinstance(size, dict) else getattr(size, name, None)
        if value:
            return int(value)
    raise ValueError(f"the image processor's size has no {key} (got {size!r})")


def _expand(text: str, token: str, counts: list[int], where: str) -> str:
    """Each placeholder becomes as many tokens as its image or video has merged patches."""
    pieces = text.split(token)
    if len(pieces) - 1 != len(counts):
        raise PromptMediaError(
            where,
            "prompt",
            f"renders {len(pieces) - 1} {token} placeholder(s) through the chat template but has {len(counts)} "
            "matching part(s); the template must emit one placeholder per image/video part",
        )
    return "".join(piece + token * count for piece, count in zip(pieces, counts)) + pieces[-1]


def qwen_vl_packer(model_path: str, default_fps: float = DEFAULT_FPS) -> QwenVLPacker:
    """The built-in factory for Qwen2.5-VL model directories."""
    from transformers import AutoImageProcessor

    tokenizer = load_chat_tokenizer(model_path)
    if tokenizer.chat_template is None:
        # Hub checkpoints of this family keep the template in the processor's file.
        legacy = Path(model_path) / "chat_template.json"
        if legacy.is_file():
            tokenizer.chat_template = json.loads(legacy.read_text())["chat_template"]
    return QwenVLPacker(tokenizer, AutoImageProcessor.from_pretrained(model_path), default_fps=default_fps)
