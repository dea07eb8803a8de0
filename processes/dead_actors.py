"""What the run does with an actor that failed or is no longer wanted: kill it without
minding that it may be gone already, and quote its error in one line."""

from __future__ import annotations

from typing import Any

import ray


def kill_quietly(handle: Any) -> None:
    try:
        ray.kill(handle)
    except Exception:  # already dead: nothing to release
        pass


def first_line(error: BaseException) -> str:
    """An error's first line, or its class where it has no text: Ray's errors carry the
    remote traceback below it."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
