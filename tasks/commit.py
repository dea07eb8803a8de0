"""The commit task: a checkpoint boundary as a Prefect task result (S-CKPT-2)."""

from __future__ import annotations

from typing import Any

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from checkpoint.boundary import CommittedBoundary, boundary_name, boundary_path, update_latest, write_marker
from checkpoint.retention import prune_optimizer_state
from tasks.faults import fault_point


@task(name="commit", task_run_name="commit[iter={iteration}]", cache_policy=NO_CACHE, persist_result=False)
def commit_stage(
    roles,
    checkpoints_root: str,
    iteration: int,
    policy_version: int,
    loop_state: dict[str, Any],
    keep_optim_last: int | None = None,
) -> CommittedBoundary:
    """Every role saves and verifies its save (inside `save`); only then the marker,
    only then the pointer, only then retention touches older boundaries. An
    exception anywhere leaves the previous boundary as the resume point."""
    logger = get_run_logger()
    boundary = boundary_path(checkpoints_root, iteration)
    policy_report, critic_report, _ = ray.get(
        [
            roles.policy.save.remote(f"{boundary}/policy"),
            roles.critic.save.remote(f"{boundary}/critic"),
            roles.data.save.remote(f"{boundary}/data"),
        ]
    )
    role_steps = {"policy": policy_report["optimizer_step"], "critic": critic_report["optimizer_step"]}
    fault_point(iteration, "before_marker")
    write_marker(boundary, iteration=iteration, role_steps=role_steps, loop_state=loop_state)
    update_latest(checkpoints_root, iteration)
    committed = CommittedBoundary(iteration=iteration, path=boundary, role_steps=role_steps, policy_version=policy_version)
    logger.info(f"committed {boundary} (role_steps={role_steps}, policy_version={policy_version})")
    pruned = prune_optimizer_state(checkpoints_root, keep_optim_last)
    if pruned:
        logger.info(f"retention removed optimizer state from {len(pruned)} older role folders")
    return committed


@task(name="save_artifact", task_run_name="save_artifact[iter={iteration}]", cache_policy=NO_CACHE, persist_result=False)
def save_artifact_stage(roles, artifacts_root: str, iteration: int) -> str:
    """A weights-only save (S-CKPT-5): never verified for resume, never marked,
    never moves latest_checkpoint.txt."""
    folder = f"{artifacts_root.rstrip('/')}/{boundary_name(iteration)}"
    ray.get([roles.policy.save.remote(f"{folder}/policy", "model"), roles.critic.save.remote(f"{folder}/critic", "model")])
    get_run_logger().info(f"saved weights-only artifact {folder}")
    return folder


@task(name="export", task_run_name="export[iter={iteration}]", cache_policy=NO_CACHE, persist_result=False)
def export_stage(boundary: str, out: str, iteration: int) -> dict[str, str]:
    """Plain HF folders of the final boundary, built in a Ray worker so the flow
    process never loads model weights."""
    from checkpoint.export import export_boundary

    written = ray.get(ray.remote(num_cpus=0)(export_boundary).remote(boundary, out))
    get_run_logger().info(f"exported {boundary} to {out}")
    return written
