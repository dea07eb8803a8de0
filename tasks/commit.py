"""The commit task: a checkpoint boundary as a Prefect task result (S-CKPT-2)."""

from __future__ import annotations

from typing import Any

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

from checkpoint.boundary import MARKER_NAME, CommittedBoundary, update_latest, write_marker, write_metrics_row
from checkpoint.boundary_files import boundary_files
from checkpoint.retention import prune_optimizer_state
from placement.plan import TRAINER_ROLES
from tasks.stages import STAGE_TASK, resolve, stage_logger


@task(name="commit", task_run_name="commit[iter={iteration}]", **STAGE_TASK)
def commit(
    iteration: int,
    saves: dict[str, Any],
    boundary: str,
    checkpoints_root: str,
    policy_version: int,
    loop_state: dict[str, Any],
    keep_optim_last: int | None = None,
    record: dict[str, Any] | None = None,
) -> CommittedBoundary:
    """Every role has saved into `boundary` and verified its save (inside `save`);
    only then the marker, only then the pointer, only then retention touches older
    boundaries. An exception anywhere leaves the previous boundary as the resume point.

    `saves` maps each role to its save call's report: the policy's and the critic's
    carry the optimizer step the marker records (S-CKPT-3). The marker also records
    every file's size and sha256 (S-FAULT-3), read back here after the saves were
    verified, so what resume checks is exactly what this commit vouched for.

    `record` (the iteration's metrics row so far) is kept in the boundary too: if the
    process dies after the pointer moved but before the row reached metrics.jsonl,
    resume restores it from here (S-FAULT-2)."""
    reports = dict(zip(saves, resolve(list(saves.values()))))
    role_steps = {role: int(reports[role]["optimizer_step"]) for role in TRAINER_ROLES}
    if record is not None:
        write_metrics_row(boundary, record)
    files = boundary_files(boundary, skip=(MARKER_NAME,))
    write_marker(boundary, iteration=iteration, role_steps=role_steps, loop_state=loop_state, files=files)
    update_latest(checkpoints_root, iteration)
    committed = CommittedBoundary(
        iteration=iteration, path=boundary, role_steps=role_steps, policy_version=policy_version
    )
    logger = stage_logger()
    logger.info(f"committed {boundary} (role_steps={role_steps}, policy_version={policy_version})")
    pruned = prune_optimizer_state(checkpoints_root, keep_optim_last, up_to=iteration)
    if pruned:
        logger.info(f"retention removed optimizer state from {len(pruned)} older role folders")
    return committed


@task(name="save_artifact", task_run_name="save_artifact[iter={iteration}]", **STAGE_TASK)
def save_artifact(iteration: int, saves: dict[str, Any], folder: str) -> str:
    """A weights-only save (S-CKPT-5): never verified for resume, never marked,
    never moves latest_checkpoint.txt."""
    resolve(list(saves.values()))
    stage_logger().info(f"saved weights-only artifact {folder}")
    return folder


@task(name="export", task_run_name="export[iter={iteration}]", cache_policy=NO_CACHE, persist_result=False)
def export(iteration: int, boundary: str, out: str, exporter: Any) -> dict[str, str]:
    """Plain HF folders of the final boundary, written by `exporter` (the policy's
    actor, which has transformers imported already: a fresh worker would spend
    seconds importing it again), so the flow process never loads model weights."""
    written = ray.get(exporter.export_boundary.remote(boundary, out))
    stage_logger().info(f"exported {boundary} to {out}")
    return written
