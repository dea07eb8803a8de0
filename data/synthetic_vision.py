"""Synthetic image and video prompts made in-process, for the tiny VLM profile.

Copy-the-digit again (the completion must be the digit in the text), now with
pictures beside the text: the pictures carry no answer, they exercise every
path a vision prompt takes (packing, generation, scoring, training) in a run that
needs no file. Images are small flat-colour PNGs as base64 data URLs, so a row is
self-contained JSON like any a user could write.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Iterator

from PIL import Image


def png_data_url(colour: tuple[int, int, int], size: tuple[int, int] = (12, 12)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def copy_digit_with_pictures(num_rows: int = 1000, seed: int = 0) -> Iterator[dict]:
    """Rows in turn: a text-only prompt "7"; an image then "7"; a three-frame video
    (with `fps` on every other video row) then "7". Reference "7"."""
    rng = random.Random(seed)
    for index in range(num_rows):
        digit = str(rng.randrange(10))
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        kind = index % 3
        if kind == 0:
            yield {"prompt": digit, "reference": digit}
            continue
        if kind == 1:
            media = {"type": "image", "image": png_data_url(colour)}
        else:
            frames = [png_data_url(tuple((c + 40 * step) % 256 for c in colour)) for step in range(3)]
            media = {"type": "video", "video": frames}
            if index % 2:
                media["fps"] = 1.0
        content = [media, {"type": "text", "text": digit}]
        yield {"prompt": [{"role": "user", "content": content}], "reference": digit}
