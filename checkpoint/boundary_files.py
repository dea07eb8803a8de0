"""What a commit vouches for, file by file: size and sha256 of every file of a boundary,
recorded in `_SUCCESS` and checked again before a resume loads anything (S-FAULT-3).

A role save is verified when it is written (S-CKPT-2), but a boundary can still be
damaged afterwards: a copy cut short, a disk error, a hand edit. Without this record a
resume fails deep inside a loader (`SafetensorError: incomplete metadata`) naming
neither the file nor the boundary.
"""

from __future__ import annotations

from typing import Any

import fsspec

from checkpoint.boundary import MARKER_NAME, CheckpointError
from checkpoint.role_layout import OPTIMIZER_FILE, OPTIMIZER_PRUNED_NOTE, SHARDED_OPTIMIZER_DIR
from files.digest import file_digest


class BoundaryCorrupt(CheckpointError):
    """A committed boundary whose files differ from what its marker recorded."""


def boundary_files(boundary: str, *, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Every file under `boundary` by path relative to it (`policy/model.safetensors`),
    less the names in `skip` (the marker itself, which cannot vouch for itself)."""
    fs, root = fsspec.core.url_to_fs(boundary)
    root = root.rstrip("/")
    records = {}
    for path in sorted(fs.find(root)):
        relative = path[len(root) + 1 :]
        if relative in skip or relative.rsplit("/", 1)[-1].endswith(".tmp"):
            continue
        records[relative] = file_digest(fs, path)
    return records


def verify_marker_files(boundary: str, marker: dict[str, Any]) -> bool:
    """Verify what the marker records; False when it records no files (a marker
    written before S-FAULT-3), which the caller reports as unverified, as S-CKPT-3
    treats a marker without role_steps."""
    recorded = marker.get("files")
    if recorded is None:
        return False
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{boundary}/{MARKER_NAME}: 'files' must map paths to size and sha256")
    verify_boundary_files(boundary, recorded)
    return True


def verify_boundary_files(boundary: str, recorded: dict[str, dict[str, Any]]) -> None:
    """Refuse the boundary unless every recorded file is there with its recorded size
    and digest. Files the marker does not list are not vouched for and not read."""
    fs, root = fsspec.core.url_to_fs(boundary)
    root = root.rstrip("/")
    refuse_pruned_optimizer(fs, root, boundary, recorded)
    for relative, expected in sorted(recorded.items()):
        path = f"{root}/{relative}"
        if not fs.exists(path):
            raise BoundaryCorrupt(
                f"{boundary}: {relative} is missing; its _SUCCESS records it ({expected['size']} bytes)"
            )
        size = fs.size(path)
        if size != expected["size"]:
            raise BoundaryCorrupt(
                f"{boundary}: {relative} is {size} bytes, its _SUCCESS records {expected['size']} "
                "(truncated or replaced)"
            )
        if file_digest(fs, path)["sha256"] != expected["sha256"]:
            raise BoundaryCorrupt(f"{boundary}: {relative} does not match the sha256 its _SUCCESS records (changed)")


def refuse_pruned_optimizer(fs: Any, root: str, boundary: str, recorded: dict[str, dict[str, Any]]) -> None:
    """Retention (S-CKPT-6) removes optimizer files from older boundaries on purpose:
    say so, rather than calling the boundary corrupt."""
    for relative in recorded:
        parts = relative.split("/")
        # `policy/optimizer.pt` (one rank) or `policy/optimizer/__0_0.distcp` (DCP shards)
        is_optimizer = parts[1:] == [OPTIMIZER_FILE] or (len(parts) > 2 and parts[1] == SHARDED_OPTIMIZER_DIR)
        if is_optimizer and fs.exists(f"{root}/{parts[0]}/{OPTIMIZER_PRUNED_NOTE}"):
            raise BoundaryCorrupt(
                f"{boundary}: {relative} was removed by retention (rl.keep_optim_last), so this boundary cannot be "
                "resumed; resume from a newer boundary, or export its weights with `python -m checkpoint.export`"
            )
