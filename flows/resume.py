"""Resume = run the flow again: find the last committed boundary, check it belongs
to this configuration, and restore every role from it (S-CKPT-2/3, S-CW-9/10)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any


from algorithm.warmup import expected_policy_version
from checkpoint.boundary import CheckpointError, atomic_write_text, read_latest, read_marker
from configs.schema import PPOConfig
from flows.run_outputs import RunPaths, read_metrics


class ResumeError(RuntimeError):
    pass


@dataclass(frozen=True)
class ResumePoint:
    boundary: str
    iteration: int
    marker: dict[str, Any]


def _logger():
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:
        return logging.getLogger("ppo.resume")


def find_resume_point(config: PPOConfig, paths: RunPaths, *, resume: bool) -> ResumePoint | None:
    """Decide where this flow run starts. Reads only; writes nothing, so a refusal
    leaves the run directory exactly as it was."""
    latest = read_latest(paths.checkpoints)
    if not resume:
        if latest is not None:
            raise ResumeError(
                f"run {config.job.name!r} already has a committed boundary ({latest}); refusing to start fresh over it. "
                "Resume it (resume=True, the default), pick another job.name, or move the folder away."
            )
        return None
    if latest is None:
        return None
    marker = read_marker(latest)
    assert marker is not None  # read_latest refuses uncommitted boundaries
    check_loop_state(marker, config, latest)
    return ResumePoint(boundary=latest, iteration=int(marker["iteration"]), marker=marker)


def check_loop_state(marker: dict[str, Any], config: PPOConfig, boundary: str) -> None:
    configured = config.rl.critic_warmup_iterations
    loop_state = marker.get("loop_state")
    if loop_state is None or "critic_warmup_iterations" not in loop_state:
        # S-CW-10: unknown, not a mismatch; the derived policy_version check still runs.
        _logger().warning(
            f"{boundary} records no critic_warmup_iterations; the configured value {configured} could not be verified"
        )
        return
    recorded = loop_state["critic_warmup_iterations"]
    if recorded != configured:
        raise ResumeError(
            f"{boundary} was written with rl.critic_warmup_iterations={recorded} but this run is configured "
            f"with {configured}; resume refused (S-CW-9). Use the recorded value or start a new job.name."
        )


def restore_roles(run, roles, point: ResumePoint, config: PPOConfig, paths: RunPaths) -> int:
    """Load every role from the boundary into the (possibly fresh) actors or role
    objects (`run` is a runner of flows/runners.py), verify the counters the marker
    vouches for, and hand the rollout the restored weights. Returns the restored
    policy_version."""
    boundary = point.boundary
    # Every rank of a data-parallel trainer loads the one copy rank 0 saved; all
    # loads are submitted before any is awaited.
    policy_loads = [run.call(rank.load, f"{boundary}/policy") for rank in roles.ranks("policy")]
    critic_loads = [run.call(rank.load, f"{boundary}/critic") for rank in roles.ranks("critic")]
    states = run.get([*policy_loads, *critic_loads, run.call(roles.data.load, f"{boundary}/data")])
    policy_state, critic_state = states[0], states[len(policy_loads)]
    observed = {"policy": int(policy_state["optimizer_step"]), "critic": int(critic_state["optimizer_step"])}
    recorded = point.marker.get("role_steps")
    if recorded is None:
        # S-CKPT-3: an older marker without role_steps: all roles must agree.
        _logger().warning(f"{boundary}/_SUCCESS has no role_steps; checking that all roles agree instead")
        if len(set(observed.values())) != 1:
            raise ResumeError(f"{boundary}: roles disagree on optimizer steps {observed} and the marker records none")
    else:
        for role, steps in observed.items():
            if int(recorded.get(role, -1)) != steps:
                raise ResumeError(
                    f"{boundary}: {role} restored at optimizer step {steps}, the marker recorded {recorded.get(role)}"
                )
    configured_shape = [config.rl.epochs, config.rl.minibatch_size, config.rl.micro_batch_size]
    for role, state in (("policy", policy_state), ("critic", critic_state)):
        saved_shape = state.get("plan_shape")
        if saved_shape is not None and list(saved_shape) != configured_shape:
            raise ResumeError(
                f"{boundary}: {role} was trained with update plan (epochs, minibatch, micro-batch) = "
                f"{tuple(saved_shape)}, this run is configured with {tuple(configured_shape)} (S-FLOW-4)"
            )
    policy_version = int(policy_state["policy_version"])
    expected = expected_policy_version(point.iteration, config.rl.critic_warmup_iterations)
    if policy_version != expected:
        raise ResumeError(
            f"{boundary}: restored policy_version {policy_version} but iteration {point.iteration} with "
            f"{config.rl.critic_warmup_iterations} warmup iterations implies {expected} (S-CW-9)"
        )
    weights, version = run.call(roles.policy.current_weights, returns=2)
    run.get([run.call(engine.load_weights, weights, version) for engine in roles.ranks("rollout")])
    truncate_metrics(paths.metrics, point.iteration)
    _logger().info(f"resumed from {boundary} (iteration {point.iteration}, policy_version {policy_version})")
    return policy_version


def truncate_metrics(path: str, last_iteration: int) -> None:
    """Drop metric lines of iterations after the boundary: they are replayed, and
    the file must read like the uninterrupted run's."""
    records = read_metrics(path)
    kept = [r for r in records if int(r.get("iteration", 0)) <= last_iteration]
    if len(kept) != len(records):
        atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
