"""A small JSONL file mixing text-only, image and video prompts, with its pictures
made by Pillow (and PyAV for the video file) in a temp folder: the fixture of the
vision-language tests (S-DATA-2, S-RUN-6)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image


def _picture(colour: tuple[int, int, int], size=(16, 24)) -> Image.Image:
    pixels = np.zeros((*size, 3), dtype=np.uint8)
    pixels[...] = colour
    pixels[::4, ::4] = (255, 255, 255)
    return Image.fromarray(pixels)


def write_mp4(path: Path, num_frames: int = 8, fps: int = 4) -> Path:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for i in range(num_frames):
            frame = np.full((24, 32, 3), 25 * i, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def mixed_rows(directory: Path) -> list[dict]:
    """Eight rows, one per way a prompt can arrive (the order is the file order)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200), (90, 90, 0)]):
        path = directory / f"picture{i}.png"
        _picture(colour).save(path)
        paths.append(path)
    buffer = io.BytesIO()
    _picture((10, 120, 240)).save(buffer, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    video_file = write_mp4(directory / "clip.mp4")

    def user(*parts):
        return [{"role": "user", "content": list(parts)}]

    def text(digit):
        return {"type": "text", "text": digit}

    prompts = [
        "3",
        user(text("4")),
        user({"type": "image", "image": str(paths[0])}, text("5")),
        user({"type": "image", "image": paths[1].as_uri()}, text("6")),
        user(text("7"), {"type": "image", "image": data_url}),
        user({"type": "video", "video": [str(p) for p in paths[:3]], "fps": 1.0}, text("8")),
        user({"type": "video", "video": [str(p) for p in paths[1:]]}, text("9")),
        user({"type": "video", "video": video_file.as_uri()}, text("0")),
    ]
    return [{"prompt": prompt, "reference": str((i + 3) % 10)} for i, prompt in enumerate(prompts)]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
