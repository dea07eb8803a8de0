"""The commit: a checkpoint boundary as a stage result (S-CKPT-2), and the weights-only
save. Plain functions like tasks/stages.py; the flow runs them as Prefect tasks."""

from __future__ import annotations

from typing import Any

from checkpoint.boundary import MARKER_NAME, CommittedBoundary, update_latest, write_marker, write_metrics_row
from checkpoint.boundary_files import boundary_files
from files.durable import sync_boundary
from checkpoint.retention import prune_optimizer_state
from placement.plan import TRAINER_ROLES
from tasks.stages import stage_log


def commit(
    iteration: int,
    saves: dict[str, dict[str, Any]],
    boundary: str,
    checkpoints_root: str,
    policy_version: int,
    loop_state: dict[str, Any],
    keep_optim_last: int | None = None,
    record: dict[str, Any] | None = None,
) -> CommittedBoundary:
    """Runs once every role has saved into `boundary` and verified its save: only then
    the marker, only then the pointer, only then retention touches older boundaries,
    so an exception anywhere leaves the previous boundary as the resume point.

    The marker records the trainers' optimizer steps (S-CKPT-3) and every file's size
    and sha256, read back after the saves were verified (S-FAULT-3). `record`, the
    iteration's metrics row, is kept too: resume restores it if the process died
    between the pointer moving and the row reaching metrics.jsonl (S-FAULT-2)."""
    role_steps = {role: int(saves[role]["optimizer_step"]) for role in TRAINER_ROLES if role in saves}
    if record is not None:
        write_metrics_row(boundary, record)
    files = boundary_files(boundary, skip=(MARKER_NAME,))
    sync_boundary(boundary, files)  # S-CKPT-9: on disk before the marker vouches for it
    write_marker(boundary, iteration=iteration, role_steps=role_steps, loop_state=loop_state, files=files)
    update_latest(checkpoints_root, iteration)
    committed = CommittedBoundary(
        iteration=iteration, path=boundary, role_steps=role_steps, policy_version=policy_version
    )
    logger = stage_log.get()
    logger.info(f"committed {boundary} (role_steps={role_steps}, policy_version={policy_version})")
    pruned = prune_optimizer_state(checkpoints_root, keep_optim_last, up_to=iteration)
    if pruned:
        logger.info(f"retention removed optimizer state from {len(pruned)} older role folders")
    return committed


def save_artifact(iteration: int, folder: str) -> str:
    """Done once every rank has saved its weights into `folder` (the runner waits for
    the saves): a weights-only save (S-CKPT-5), never verified for resume, never
    marked, never moves latest_checkpoint.txt."""
    stage_log.get().info(f"saved weights-only artifact {folder}")
    return folder
