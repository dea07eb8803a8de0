"""The Prefect tasks of one PPO iteration (S-FLOW-1), and the actor calls behind them.

An iteration's actor calls are queued in stage order up front (`dispatch_iteration`):
each call takes the previous stage's object reference as its argument, so Ray starts
a stage the moment the one before it finishes and the bulk moves actor to actor
through the object store (S-FLOW-2). Each stage's Prefect task then waits for its own
stage, logs the stage's metrics (prints inside actors never reach the UI) and
completes when the stage completes. The task history therefore still reads one task
per stage with its true end time, and an actor's error fails the task of the stage
that raised it, while Prefect's own per-task bookkeeping (about 10 ms a task here)
runs alongside the next stage's compute instead of between stages (docs/performance.md).

No task caches or persists results: resume reads committed boundaries, not Prefect
results, and a cached task would claim a stage ran when it did not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from algorithm.update_plan import UpdatePlan
from roles.trajectory import TrainReceipt

STAGE_TASK = {"cache_policy": NO_CACHE, "persist_result": False, "retries": 0}


@dataclass
class IterationInFlight:
    """References to one iteration's queued actor calls; nothing here is bulk data."""

    iteration: int
    summaries: dict[str, ray.ObjectRef] = field(default_factory=dict)  # stage -> its metrics dict
    batch_id: ray.ObjectRef | None = None
    installs: list[ray.ObjectRef] = field(default_factory=list)  # every trainer rank's {"batch_id": ...} for the targets
    receipts: dict[str, list[ray.ObjectRef]] = field(default_factory=dict)  # role -> a TrainReceipt per rank
    policy_version: ray.ObjectRef | None = None  # set when the iteration publishes weights
    follows: list[ray.ObjectRef] = field(default_factory=list)  # rollout engines 1.. and policy ranks 1.. taking the new version
    park: list[ray.ObjectRef] = field(default_factory=list)  # each policy rank's park summary (S-RUN-4)


def dispatch_iteration(
    roles, iteration: int, batch_size: int, required_version: int, plan: UpdatePlan, actor_warmup: bool
) -> IterationInFlight:
    """Queue every actor call of one iteration, in S-FLOW-1 order, without waiting.

    Ray runs one actor's calls in the order this process submitted them, and a call
    whose argument is a failed reference fails without running, so a stage that
    raises stops everything downstream of it. Weight publication takes the policy's
    receipt as an argument for the same reason: untrained weights are never published.
    During critic warmup nothing touches the actor (S-CW-5). The policy's last call
    parks it on the host, so the next rollout finds the shared GPU free (S-RUN-4; a
    no-op returning `{}` wherever the policy does not park)."""
    calls = IterationInFlight(iteration)
    s = calls.summaries
    prompts, s["data"] = roles.data.next_batch.options(num_returns=2).remote(iteration, batch_size)
    engines = roles.ranks("rollout")
    if len(engines) == 1:
        trajectory, s["rollout"] = roles.rollout.generate.options(num_returns=2).remote(prompts, required_version)
    else:
        # Each engine generates its shard; engine 0 gathers them into one batch.
        shards = [
            engine.generate.options(num_returns=2).remote(prompts, required_version, index, len(engines))
            for index, engine in enumerate(engines)
        ]
        trajectory, s["rollout"] = roles.rollout.gather.options(num_returns=2).remote(
            len(engines), *(part for part, _ in shards), *(summary for _, summary in shards)
        )
    trajectory, s["reward"] = roles.reward.score.options(num_returns=2).remote(trajectory)
    trajectory, s["replay"], calls.batch_id = roles.replay.add.options(num_returns=3).remote(trajectory)
    trajectory, s["reference_score"] = roles.reference.score.options(num_returns=2).remote(trajectory)
    trajectory, s["critic_predict"] = roles.critic.predict.options(num_returns=2).remote(trajectory)
    # policy.prepare_batch (rank 0) freezes the targets; every critic rank and the
    # policy's other ranks receive the very same object by reference (S-FLOW-3).
    targets, s["prepare_batch"] = roles.policy.prepare_batch.options(num_returns=2).remote(trajectory)
    policy_ranks, critic_ranks = roles.ranks("policy"), roles.ranks("critic")
    calls.installs = [rank.install_targets.remote(targets) for rank in critic_ranks + policy_ranks[1:]]
    calls.receipts["critic"] = [rank.train_batch.remote(plan, calls.batch_id) for rank in critic_ranks]
    if not actor_warmup:
        calls.receipts["policy"] = [rank.train_batch.remote(plan, calls.batch_id) for rank in policy_ranks]
        weights, calls.policy_version = roles.policy.publish_weights.options(num_returns=2).remote(
            *calls.receipts["policy"]
        )
        s["weight_sync"] = roles.rollout.load_weights.remote(weights, calls.policy_version)
        calls.follows += [engine.load_weights.remote(weights, calls.policy_version) for engine in engines[1:]]
        calls.follows += [rank.follow_version.remote(calls.policy_version) for rank in policy_ranks[1:]]
    # After publish_weights: Ray runs one actor's calls in order.
    calls.park = [rank.park.remote() for rank in policy_ranks]
    return calls


def await_park(calls: IterationInFlight) -> dict[str, float]:
    """Block until every policy rank has parked (S-RUN-4); returns rank 0's park
    metrics. The flow calls it before the next iteration is dispatched, so the next
    rollout never generates while the trainer still holds the shared GPU."""
    summaries = ray.get(calls.park)
    return summaries[0] if summaries else {}


def _log_metrics(metrics: dict[str, Any]) -> None:
    if metrics:
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items()))
        get_run_logger().info(shown)


def _stage_task(stage: str, body: Callable) -> Callable:
    body.__qualname__ = body.__name__ = f"{stage}_stage"  # a distinct task key per stage
    return task(name=stage, task_run_name=stage + "[iter={iteration}]", **STAGE_TASK)(body)


def _await_metrics(stage: str, *calls_awaited: str) -> Callable:
    """A task that completes when the named actor calls have: the stage's own call and
    the cheap bookkeeping calls folded into it (the data cursor's batch into rollout,
    the replay buffer's batch id into reward), which as tasks of their own cost ten
    times their compute in Prefect bookkeeping."""

    def wait(calls: IterationInFlight, iteration: int) -> dict[str, Any]:
        summaries = ray.get([calls.summaries[name] for name in calls_awaited])
        logged = {k: v for summary in summaries for k, v in summary.items()}
        _log_metrics(logged)
        # Identities (the replay's batch id) are logged, not recorded: metrics are numbers.
        return {k: v for k, v in logged.items() if isinstance(v, (int, float))}

    return _stage_task(stage, wait)


rollout_stage = _await_metrics("rollout", "data", "rollout")
reward_stage = _await_metrics("reward", "reward", "replay")
reference_stage = _await_metrics("reference_score", "reference_score")
critic_predict_stage = _await_metrics("critic_predict", "critic_predict")


def _prepare_batch(calls: IterationInFlight, iteration: int) -> tuple[str, dict[str, Any]]:
    """Done when the targets are frozen and every trainer rank holds them. Returns the
    batch id all ranks agree on, which they will quote in their receipts (S-FLOW-5)."""
    metrics, *installed = ray.get([calls.summaries["prepare_batch"], *calls.installs])
    batch_ids = {summary["batch_id"] for summary in installed}
    if len(batch_ids) != 1:
        raise RuntimeError(f"iteration {iteration}: trainer ranks hold different batches {sorted(batch_ids)} (S-FLOW-5)")
    _log_metrics(metrics)
    return batch_ids.pop(), metrics


prepare_batch_stage = _stage_task("prepare_batch", _prepare_batch)


def _await_receipt(role: str) -> Callable:
    def wait(calls: IterationInFlight, iteration: int) -> list[TrainReceipt]:
        """Every rank's receipt, rank 0 first; the metrics logged are rank 0's, which
        (summed over all ranks' shards) describe the whole update."""
        receipts = ray.get(calls.receipts[role])
        _log_metrics(receipts[0].metrics)
        return receipts

    return _stage_task(f"train_{role}", wait)


train_policy_stage = _await_receipt("policy")
train_critic_stage = _await_receipt("critic")


def _weight_sync(calls: IterationInFlight, iteration: int) -> tuple[int, dict[str, float]]:
    """The policy's new weights go to the rollout engine actor to actor through the
    object store, never through this process (S-FLOW-6); every rollout engine loads
    them. Done once every engine and every policy rank holds the new version and
    every policy rank has parked (S-RUN-4)."""
    metrics, policy_version, *_ = ray.get([calls.summaries["weight_sync"], calls.policy_version, *calls.follows])
    metrics = {**metrics, **await_park(calls)}
    _log_metrics(metrics)
    return policy_version, metrics


weight_sync_stage = _stage_task("weight_sync", _weight_sync)
