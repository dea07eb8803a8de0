"""The boundary coordinator: names boundaries, writes the `_SUCCESS` marker and the
latest pointer atomically, and reads them back for resume (S-CKPT-1..4).

The marker is written only after every role's save has been verified, and the
pointer only after the marker: a crash at any point leaves the previous committed
boundary as the resume point. Nothing here ever deletes a committed boundary.
"""

from __future__ import annotations

import json
import re
from typing import Any

import fsspec
from pydantic import BaseModel, Field

from files.durable import replace_durably, sync_folder

MARKER_NAME = "_SUCCESS"
LATEST_POINTER = "latest_checkpoint.txt"
MARKER_VERSION = 1
_BOUNDARY_NAME = re.compile(r"iter_[0-9]{6,}")


class CheckpointError(RuntimeError):
    pass


class CommittedBoundary(BaseModel):
    """The commit task's result: what the Prefect UI shows for each commit."""

    iteration: int = Field(description="Outer iteration the boundary closes.")
    path: str = Field(description="Boundary directory.")
    role_steps: dict[str, int] = Field(description="Each trainable role's optimizer-step counter.")
    policy_version: int = Field(description="Published actor updates at this boundary.")


def boundary_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def boundary_path(checkpoints_root: str, iteration: int) -> str:
    return f"{checkpoints_root.rstrip('/')}/{boundary_name(iteration)}"


def atomic_write_text(path: str, text: str) -> None:
    """Readers see the old content or the new, never a torn file, and the new survives
    a power cut once this returns (files/durable.py)."""
    replace_durably(path, text)


def write_marker(
    boundary: str,
    *,
    iteration: int,
    role_steps: dict[str, int],
    loop_state: dict[str, Any],
    files: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`files` (relative path -> size and sha256, checkpoint/boundary_files.py) is
    what resume verifies before loading (S-FAULT-3); optional, like loop_state, so the
    marker version stays 1 and older markers stay readable."""
    for key, value in loop_state.items():
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise CheckpointError(f"loop_state[{key!r}] must be a JSON scalar, got {type(value).__name__}")
    marker = {"version": MARKER_VERSION, "iteration": iteration, "role_steps": role_steps, "loop_state": loop_state}
    if files is not None:
        marker["files"] = files
    atomic_write_text(f"{boundary}/{MARKER_NAME}", json.dumps(marker, indent=2, sort_keys=True))
    return marker


def _read_text(path: str) -> str | None:
    """A small marker or pointer file's text; None when it does not exist. Bytes that
    are not UTF-8 are refused naming the file and offset."""
    try:
        with fsspec.open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(
            f"{path}: byte {error.start} is not UTF-8 ({error.reason}); the file is damaged"
        ) from None


def read_marker(boundary: str) -> dict[str, Any] | None:
    """The marker of a committed boundary, or None when the boundary was never
    committed (no `_SUCCESS`: invisible to resume, S-CKPT-2). An accepted marker has
    the shape resume relies on, so a damaged one fails here naming the file, not
    later as a TypeError inside resume."""
    path = f"{boundary}/{MARKER_NAME}"
    text = _read_text(path)
    if text is None:
        return None
    try:
        marker = json.loads(text)
    except json.JSONDecodeError as error:
        raise CheckpointError(
            f"{path} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
        ) from None
    except (ValueError, RecursionError):  # valid JSON Python will not build: huge integers, deep nesting
        raise CheckpointError(f"{path}: the JSON holds a number too long or nesting too deep to read") from None
    if not isinstance(marker, dict) or type(marker.get("iteration")) is not int or marker["iteration"] < 0:
        raise CheckpointError(f"{path}: expected a JSON object with a non-negative integer 'iteration'")
    role_steps = marker.get("role_steps")
    if role_steps is not None and not (
        isinstance(role_steps, dict) and all(type(steps) is int for steps in role_steps.values())
    ):
        raise CheckpointError(f"{path}: 'role_steps' must map role names to integers, got {role_steps!r}")
    loop_state = marker.get("loop_state")
    if loop_state is not None and not isinstance(loop_state, dict):
        raise CheckpointError(f"{path}: 'loop_state' must be a JSON object, got {loop_state!r}")
    return marker


def committed_loop_state(boundary: str) -> dict[str, Any] | None:
    """The entrypoint's run-level state, verbatim; None for a marker without one
    (S-CKPT-4, S-CW-10)."""
    marker = read_marker(boundary)
    if marker is None:
        raise CheckpointError(f"{boundary} is not a committed boundary (no {MARKER_NAME})")
    return marker.get("loop_state")


METRICS_ROW = "metrics_row.json"
"""The boundary's own iteration's metrics row (S-FAULT-2), vouched for by the marker."""


def write_metrics_row(boundary: str, record: dict[str, Any]) -> None:
    atomic_write_text(f"{boundary.rstrip('/')}/{METRICS_ROW}", json.dumps(record, sort_keys=True))


def read_metrics_row(boundary: str) -> dict[str, Any] | None:
    """The row the commit kept, or None for a boundary written before rows were kept."""
    text = _read_text(f"{boundary.rstrip('/')}/{METRICS_ROW}")
    if text is None:
        return None
    try:
        row = json.loads(text)
    except ValueError as error:
        raise CheckpointError(f"{boundary}/{METRICS_ROW} is not valid JSON ({error})") from None
    if not isinstance(row, dict):
        raise CheckpointError(f"{boundary}/{METRICS_ROW} holds {type(row).__name__}, expected a JSON object")
    return row


def update_latest(checkpoints_root: str, iteration: int) -> None:
    atomic_write_text(f"{checkpoints_root.rstrip('/')}/{LATEST_POINTER}", boundary_name(iteration) + "\n")


def read_latest_name(checkpoints_root: str) -> str | None:
    """The boundary name the pointer holds, unchecked; None when there is no pointer."""
    text = _read_text(f"{checkpoints_root.rstrip('/')}/{LATEST_POINTER}")
    return None if text is None else text.strip()


def clear_for_commit(checkpoints_root: str, iteration: int) -> bool:
    """Empty the folder a commit is about to write, before any role saves into it.

    It exists after a commit that crashed before its marker, or over the abandoned branch
    of a `--resume-from`. Saving over it in place would leave an old `_SUCCESS` vouching
    for a mix of files, so the old marker goes first (the folder is then invisible to
    resume, S-CKPT-2), then the folder. The boundary the pointer names is refused."""
    boundary = boundary_path(checkpoints_root, iteration)
    fs, path = fsspec.core.url_to_fs(boundary)
    if not fs.exists(path):
        return False
    if read_latest_name(checkpoints_root) == boundary_name(iteration):
        raise CheckpointError(f"refusing to commit over {boundary}: {LATEST_POINTER} names it as the resume point")
    if fs.exists(f"{path}/{MARKER_NAME}"):
        fs.rm(f"{path}/{MARKER_NAME}")
        sync_folder(boundary)  # the marker is gone for good before any file it vouched for
    fs.rm(path, recursive=True)
    return True


def read_latest(checkpoints_root: str) -> str | None:
    """Path of the boundary the pointer names, or None when nothing was committed.
    A pointer to a boundary that is missing or uncommitted is an error, not a
    silent fresh start: that would overwrite a run."""
    pointer = f"{checkpoints_root.rstrip('/')}/{LATEST_POINTER}"
    text = _read_text(pointer)
    if text is None:
        return None
    name = text.strip()
    # The whole name, not a prefix: `iter_000001/../../elsewhere` must not lead resume
    # out of the run's own checkpoints folder (S-SEC-2).
    if not _BOUNDARY_NAME.fullmatch(name):
        raise CheckpointError(f"{pointer} names {name[:80]!r}, expected a boundary like iter_000012")
    boundary = f"{checkpoints_root.rstrip('/')}/{name}"
    if read_marker(boundary) is None:
        raise CheckpointError(
            f"{pointer} points at {name}, which has no {MARKER_NAME}: refusing to resume or overwrite"
        )
    return boundary
