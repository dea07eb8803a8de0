"""The one floor under the waits that cover a run's start-up: every actor importing and
loading its model at once, from a disk that may be slow."""

from __future__ import annotations

STARTUP_FLOOR_SECONDS = 900.0


def startup_timeout(stage_timeout_s: float | None) -> float | None:
    """How long an actor may take to start: at least 15 minutes, or the stage timeout if
    that is longer (a large model from a slow disk); None where stages are unbounded."""
    return None if stage_timeout_s is None else max(STARTUP_FLOOR_SECONDS, stage_timeout_s)
