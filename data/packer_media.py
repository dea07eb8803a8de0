"""Image and video payloads of content parts, opened for a DataPacker.

Here and not in the projection, which hands the row on untouched: only a packer that
shows pictures to a model needs the pixels, and it knows the row's position when opening
them fails, so every error names the row, the key path and the path that could not be
read. docs/howto/custom-datapacker.md lists the payload forms accepted.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from PIL import Image, UnidentifiedImageError

from data.prompt_projection import PromptError

IMAGE_TYPES = frozenset({"image", "image_url"})
VIDEO_TYPES = frozenset({"video", "video_url"})


class PromptMediaError(PromptError):
    """A content part's image or video cannot be opened.

    Worded like every prompt error: where the row is ("rows.jsonl row 3 (line 4,
    column 1)"), then the key path inside the prompt and the path or handle that
    failed. A subclass, so callers that report prompt errors report these too.
    """


@dataclass(frozen=True)
class VideoFrames:
    """Decoded frames of one video part and the rate they were taken at."""

    frames: list[Image.Image]
    fps: float


def media_kind(part: Mapping) -> str | None:
    """"image", "video" or None (text) for a projected content part."""
    kind = part.get("type")
    if kind in IMAGE_TYPES:
        return "image"
    if kind in VIDEO_TYPES:
        return "video"
    return None


def part_payload(part: Mapping, kind: str, where: str, key_path: str) -> tuple[str, Any]:
    """The key path and value holding a part's image or video."""
    for key in (kind, f"{kind}_url", "url", "path"):
        value = part.get(key)
        if value is None:
            continue
        if key == f"{kind}_url" and isinstance(value, Mapping):
            return f"{key_path}.{key}.url", value.get("url")
        return f"{key_path}.{key}", value
    raise PromptMediaError(
        where,
        key_path,
        f"has type {part.get('type')!r} but no payload; accepted keys: {kind}, {kind}_url, url, path (a "
        "placeholder whose picture sits in another column cannot be packed: the packer sees only the prompt)",
    )


def open_image(value: Any, where: str, key_path: str) -> Image.Image:
    """An RGB PIL image from any accepted image payload."""
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if not isinstance(value, str) or not value:
        raise PromptMediaError(where, key_path, f"is {type(value).__name__}; expected a path, URL or base64 image")
    if value.startswith(("http://", "https://")):
        from transformers.image_utils import load_image

        try:
            return load_image(value).convert("RGB")
        except Exception as error:  # network and decoding errors alike: name the row
            raise PromptMediaError(where, key_path, f"cannot fetch image {value!r}: {error}") from None
    if value.startswith("data:"):
        header, _, data = value.partition(",")
        if ";base64" not in header:
            raise PromptMediaError(where, key_path, f"is a data URL that is not base64 ({header!r})")
        return _decode_image(_b64decode(data, where, key_path), where, key_path, "base64 data")
    path = _local_path(value)
    if os.path.isfile(path):
        try:
            with Image.open(path) as image:
                return image.convert("RGB")
        except (UnidentifiedImageError, OSError) as error:
            raise PromptMediaError(where, key_path, f"cannot read image file {path!r}: {error}") from None
    raw = _maybe_bare_base64(value) if not value.startswith("file://") else None
    if raw is not None:
        return _decode_image(raw, where, key_path, "base64 data")
    raise PromptMediaError(where, key_path, f"names image file {path!r}, which does not exist")


def load_part_image(part: Mapping, part_path: str, where: str) -> Image.Image:
    """The RGB image of an image part (`part_path` e.g. "prompt[0].content[1]")."""
    key_path, value = part_payload(part, "image", where, part_path)
    return open_image(value, where, key_path)


def load_part_video(part: Mapping, part_path: str, where: str, default_fps: float) -> VideoFrames:
    """Frames of a video part: a list of frame images, or a video file decoded with PyAV.
    A null `fps` is the packer's to interpret (S-DATA-5): it means "not given"."""
    key_path, value = part_payload(part, "video", where, part_path)
    fps = part.get("fps")
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps <= 0):
        raise PromptMediaError(where, f"{part_path}.fps", f"is {fps!r}; expected a positive number or null")
    fps = float(fps if fps is not None else default_fps)
    if isinstance(value, Sequence) and not isinstance(value, str):
        if not value:
            raise PromptMediaError(where, key_path, "is an empty list of frames")
        return VideoFrames([open_image(frame, where, f"{key_path}[{i}]") for i, frame in enumerate(value)], fps)
    if not isinstance(value, str) or not value:
        raise PromptMediaError(where, key_path, f"is {type(value).__name__}; expected a list of frames or a video file")
    path = value if value.startswith(("http://", "https://")) else _local_path(value)
    if not path.startswith(("http://", "https://")) and not os.path.isfile(path):
        raise PromptMediaError(where, key_path, f"names video file {path!r}, which does not exist")
    return _decode_video_file(path, fps, where, key_path)


def _decode_video_file(path: str, fps: float, where: str, key_path: str) -> VideoFrames:
    from transformers.utils import is_av_available
    from transformers.video_utils import load_video

    if not is_av_available():
        raise PromptMediaError(
            where, key_path, f"names video file {path!r}; decoding video files needs PyAV (pip install av)"
        )
    try:
        array, metadata = load_video(path, fps=fps, backend="pyav")
    except Exception as error:  # decoder errors name neither the row nor the file
        raise PromptMediaError(where, key_path, f"cannot decode video file {path!r} at {fps} fps: {error}") from None
    if len(array) == 0:
        raise PromptMediaError(where, key_path, f"video file {path!r} gave no frames at {fps} fps")
    return VideoFrames([Image.fromarray(frame).convert("RGB") for frame in array], float(metadata.sampled_fps))


def _local_path(value: str) -> str:
    if value.startswith("file://"):
        parsed = urlparse(value)
        # file:///abs/path and file://localhost/abs/path; a host name is not a local file.
        return unquote(parsed.path) if parsed.netloc in ("", "localhost") else value
    return value


def _b64decode(data: str, where: str, key_path: str) -> bytes:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError) as error:
        raise PromptMediaError(where, key_path, f"holds base64 data that does not decode: {error}") from None


def _maybe_bare_base64(value: str) -> bytes | None:
    """Bare base64 (no `data:` header) is accepted as transformers accepts it; a string
    that is not valid base64 is a path, so a missing file is reported as one."""
    if len(value) < 16 or "." in value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def _decode_image(raw: bytes, where: str, key_path: str, what: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(raw)) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise PromptMediaError(where, key_path, f"holds {what} that is not an image: {error}") from None
