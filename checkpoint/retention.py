"""Retention of optimizer state across committed boundaries (S-CKPT-6).

Optimizer state is the bulk of a full boundary (AdamW keeps two moments per
parameter). Older boundaries keep their weights; only their optimizer files go, and
only after a newer boundary is committed. The role folder then says so, so a resume
from it fails with a reason instead of a missing-file error.
"""

from __future__ import annotations

import fsspec

from checkpoint.boundary import read_marker
from files.durable import replace_durably, sync_folder
from checkpoint.role_layout import OPTIMIZER_FILE, OPTIMIZER_PRUNED_NOTE, SHARDED_OPTIMIZER_DIR
from placement.plan import TRAINER_ROLES


def committed_boundaries(checkpoints_root: str) -> list[str]:
    """Committed boundary paths, oldest first."""
    fs, root = fsspec.core.url_to_fs(checkpoints_root)
    if not fs.exists(root):
        return []
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False) if p.rsplit("/", 1)[-1].startswith("iter_"))
    return [f"{checkpoints_root.rstrip('/')}/{n}" for n in names if read_marker(f"{checkpoints_root.rstrip('/')}/{n}")]


def prune_optimizer_state(checkpoints_root: str, keep_optim_last: int | None, up_to: int | None = None) -> list[str]:
    """Drop optimizer files from all but the newest K committed boundaries
    (unset -> 1 on local storage; 0 -> keep all). Returns the pruned role folders.

    `up_to` is the iteration just committed: after `--resume-from`, boundaries past it
    belong to the abandoned branch; they are neither counted as newest nor touched."""
    keep = 1 if keep_optim_last is None else keep_optim_last
    if keep == 0:
        return []
    pruned = []
    boundaries = [b for b in committed_boundaries(checkpoints_root) if up_to is None or _iteration(b) <= up_to]
    for boundary in boundaries[:-keep]:
        for role in TRAINER_ROLES:
            fs, role_dir = fsspec.core.url_to_fs(f"{boundary}/{role}")
            # One file (one rank's layout) or one DCP folder of every rank's shards.
            optimizer_paths = [f"{role_dir}/{OPTIMIZER_FILE}", f"{role_dir}/{SHARDED_OPTIMIZER_DIR}"]
            present = [path for path in optimizer_paths if fs.exists(path)]
            if present:
                # The note is on disk before the files go: a power cut in between leaves a
                # boundary refused for the right reason, never one missing a file it lists.
                note = "optimizer state removed by retention (rl.keep_optim_last)\n"
                replace_durably(f"{boundary}/{role}/{OPTIMIZER_PRUNED_NOTE}", note)
                for path in present:
                    fs.rm(path, recursive=True)
                sync_folder(f"{boundary}/{role}")
                pruned.append(f"{boundary}/{role}")
    return pruned


def _iteration(boundary: str) -> int:
    return int(boundary.rsplit("iter_", 1)[-1])
