"""The Prefect tasks of one PPO iteration (S-FLOW-1).

Each task calls one actor method and returns an object reference (the bulk stays in
Ray's object store, S-FLOW-2) plus a small metrics dict, which it also logs so the
numbers reach the Prefect UI (prints inside actors never do). No task caches or
persists results: a cached task would skip its side effect on the actor, and resume
reads committed boundaries, not Prefect results.
"""

from __future__ import annotations

from typing import Any

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from algorithm.update_plan import UpdatePlan
from roles.trajectory import TrainReceipt

STAGE_TASK = {"cache_policy": NO_CACHE, "persist_result": False, "retries": 0}


def _call_with_summary(method, *args) -> tuple[ray.ObjectRef, dict[str, Any]]:
    payload_ref, summary_ref = method.options(num_returns=2).remote(*args)
    return payload_ref, ray.get(summary_ref)


def _log_metrics(metrics: dict[str, Any]) -> None:
    if metrics:
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items()))
        get_run_logger().info(shown)


@task(name="data", task_run_name="data[iter={iteration}]", **STAGE_TASK)
def data_stage(data, iteration: int, batch_size: int):
    prompts_ref, metrics = _call_with_summary(data.next_batch, iteration, batch_size)
    _log_metrics(metrics)
    return prompts_ref, metrics


@task(name="rollout", task_run_name="rollout[iter={iteration}]", **STAGE_TASK)
def rollout_stage(rollout, prompts_ref, iteration: int, required_version: int):
    trajectory_ref, metrics = _call_with_summary(rollout.generate, prompts_ref, required_version)
    _log_metrics(metrics)
    return trajectory_ref, metrics


@task(name="reward", task_run_name="reward[iter={iteration}]", **STAGE_TASK)
def reward_stage(reward, trajectory_ref, iteration: int):
    trajectory_ref, metrics = _call_with_summary(reward.score, trajectory_ref)
    _log_metrics(metrics)
    return trajectory_ref, metrics


@task(name="replay", task_run_name="replay[iter={iteration}]", **STAGE_TASK)
def replay_stage(replay, trajectory_ref, iteration: int):
    trajectory_ref, summary = _call_with_summary(replay.add, trajectory_ref)
    _log_metrics(summary)
    return trajectory_ref, summary


@task(name="reference_score", task_run_name="reference_score[iter={iteration}]", **STAGE_TASK)
def reference_stage(reference, trajectory_ref, iteration: int):
    trajectory_ref, metrics = _call_with_summary(reference.score, trajectory_ref)
    return trajectory_ref, metrics


@task(name="critic_predict", task_run_name="critic_predict[iter={iteration}]", **STAGE_TASK)
def critic_predict_stage(critic, trajectory_ref, iteration: int):
    trajectory_ref, metrics = _call_with_summary(critic.predict, trajectory_ref)
    _log_metrics(metrics)
    return trajectory_ref, metrics


@task(name="prepare_batch", task_run_name="prepare_batch[iter={iteration}]", **STAGE_TASK)
def prepare_batch_stage(policy, critic, trajectory_ref, iteration: int):
    """policy.prepare_batch freezes the targets; critic.install_targets receives the
    very same object by reference (S-FLOW-3)."""
    targets_ref, summary_ref = policy.prepare_batch.options(num_returns=2).remote(trajectory_ref)
    # Both calls are queued before waiting, so this task pays one round trip, not two
    # (the install waits inside Ray for the targets; an error in either surfaces here).
    metrics, installed = ray.get([summary_ref, critic.install_targets.remote(targets_ref)])
    _log_metrics(metrics)
    return installed["batch_id"], metrics


@task(name="train_policy", task_run_name="train_policy[iter={iteration}]", **STAGE_TASK)
def train_policy_stage(policy, plan: UpdatePlan, batch_id: str, iteration: int) -> TrainReceipt:
    receipt = ray.get(policy.train_batch.remote(plan, batch_id))
    _log_metrics(receipt.metrics)
    return receipt


@task(name="train_critic", task_run_name="train_critic[iter={iteration}]", **STAGE_TASK)
def train_critic_stage(critic, plan: UpdatePlan, batch_id: str, iteration: int) -> TrainReceipt:
    receipt = ray.get(critic.train_batch.remote(plan, batch_id))
    _log_metrics(receipt.metrics)
    return receipt


@task(name="weight_sync", task_run_name="weight_sync[iter={iteration}]", **STAGE_TASK)
def weight_sync_stage(policy, rollout, iteration: int) -> tuple[int, dict[str, float]]:
    """Push the policy's new weights to the rollout engine; the weights travel actor
    to actor through the object store, never through this process (S-FLOW-6)."""
    weights_ref, version_ref = policy.publish_weights.options(num_returns=2).remote()
    metrics, policy_version = ray.get([rollout.load_weights.remote(weights_ref, version_ref), version_ref])
    _log_metrics(metrics)
    return policy_version, metrics
