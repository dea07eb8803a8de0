"""The commit task: a checkpoint boundary as a Prefect task result (S-CKPT-2)."""

from __future__ import annotations

from typing import Any

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from checkpoint.boundary import CommittedBoundary, boundary_path, update_latest, write_marker


@task(name="commit", task_run_name="commit[iter={iteration}]", cache_policy=NO_CACHE, persist_result=False)
def commit_stage(
    roles,
    checkpoints_root: str,
    iteration: int,
    policy_version: int,
    loop_state: dict[str, Any],
) -> CommittedBoundary:
    """Every role saves and verifies its save (inside `save`); only then the marker,
    only then the pointer. An exception anywhere leaves the previous boundary as
    the resume point."""
    boundary = boundary_path(checkpoints_root, iteration)
    policy_report, critic_report, _ = ray.get(
        [
            roles.policy.save.remote(f"{boundary}/policy"),
            roles.critic.save.remote(f"{boundary}/critic"),
            roles.data.save.remote(f"{boundary}/data"),
        ]
    )
    role_steps = {"policy": policy_report["optimizer_step"], "critic": critic_report["optimizer_step"]}
    write_marker(boundary, iteration=iteration, role_steps=role_steps, loop_state=loop_state)
    update_latest(checkpoints_root, iteration)
    committed = CommittedBoundary(
        iteration=iteration, path=boundary, role_steps=role_steps, policy_version=policy_version
    )
    get_run_logger().info(f"committed {boundary} (role_steps={role_steps}, policy_version={policy_version})")
    return committed
