"""The Prefect tasks of one PPO iteration (S-FLOW-1): one plain task per stage.

The iteration's actor calls are queued up front (flows/iteration.py); each task here
waits for its own stage's calls, checks what the stage promised, logs its metrics
(prints inside actors never reach the UI) and completes when the stage completes.
The UI therefore shows one task run per stage with its true end time, an actor's
error fails the task of the stage that raised it, and Prefect's own bookkeeping
overlaps the next stage's compute (docs/performance.md).

A task's arguments are Ray object references when the flow runs it, or the values
themselves when the in-process runner calls its `.fn` (flows/runners.py): `resolve`
waits for the first kind and passes the second through, so each body is written once.

No task caches or persists results: resume reads committed boundaries, not Prefect
results, and a cached task would claim a stage ran when it did not.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any, Sequence

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError

from contracts.trajectory import TrainReceipt
from views.samples_table import publish_samples

STAGE_TASK: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False, "retries": 0}


stage_timeout: ContextVar[float | None] = ContextVar("stage_timeout", default=None)
"""Seconds a stage may wait for its actor calls (`rl.stage_timeout_seconds`), set by
the flow's runner. A blocking `ray.get` cannot be interrupted by Prefect's own task
timeout, so the wait itself is bounded (S-FAULT-1)."""


class StageTimeout(TimeoutError):
    """A stage's actor calls did not finish in time; `late` are the references still
    outstanding, in queue order: the first is the stuck call, the others may only be
    waiting for its output."""

    def __init__(self, late: list[ray.ObjectRef], seconds: float):
        self.late = late
        self.seconds = seconds
        super().__init__(f"{len(late)} actor call(s) did not finish within {seconds:g} s (rl.stage_timeout_seconds)")


def resolve(pending: Sequence[Any]) -> list[Any]:
    """The values behind `pending`, in order, fetched in one `ray.get`: object
    references are waited for (at most `stage_timeout` seconds), plain values
    (in-process runs) pass through."""
    refs = [item for item in pending if isinstance(item, ray.ObjectRef)]
    timeout = stage_timeout.get()
    if refs and timeout is not None:
        _, late = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if late:
            outstanding = set(late)
            raise StageTimeout([ref for ref in refs if ref in outstanding], timeout)
    fetched = iter(ray.get(refs)) if refs else iter(())
    return [next(fetched) if isinstance(item, ray.ObjectRef) else item for item in pending]


def stage_logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:  # the in-process runner: no task run to log into
        return logging.getLogger("ppo.stages")


def log_metrics(metrics: dict[str, Any]) -> None:
    if metrics:
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items()))
        stage_logger().info(shown)


def numeric_metrics(*summaries: dict[str, Any]) -> dict[str, float]:
    """Merge stage summaries into metrics. Identities (the replay's batch id) are
    logged, not recorded: metrics are numbers."""
    merged = {k: v for summary in summaries for k, v in summary.items()}
    log_metrics(merged)
    return {k: v for k, v in merged.items() if isinstance(v, (int, float))}


@task(name="rollout", task_run_name="rollout[iter={iteration}]", **STAGE_TASK)
def rollout(iteration: int, data_summary: Any, rollout_summary: Any) -> dict[str, float]:
    """Done when the data cursor handed out the batch and the engines generated it.
    The data call is folded in here: as a task of its own it would cost ten times
    its compute in Prefect bookkeeping."""
    return numeric_metrics(*resolve([data_summary, rollout_summary]))


@task(name="reward", task_run_name="reward[iter={iteration}]", **STAGE_TASK)
def reward(iteration: int, reward_summary: Any, replay_summary: Any) -> dict[str, float]:
    """Done when every completion is scored and the replay buffer has named the batch."""
    return numeric_metrics(*resolve([reward_summary, replay_summary]))


@task(name="reference_score", task_run_name="reference_score[iter={iteration}]", **STAGE_TASK)
def reference_score(iteration: int, summary: Any, peers: Sequence[Any] = ()) -> dict[str, float]:
    """Done when every reference rank has scored (a sharded forward is a collective)."""
    metrics, *_ = resolve([summary, *peers])
    return numeric_metrics(metrics)


@task(name="critic_predict", task_run_name="critic_predict[iter={iteration}]", **STAGE_TASK)
def critic_predict(iteration: int, summary: Any, peers: Sequence[Any] = ()) -> dict[str, float]:
    """Done when every critic rank has run the forward (a sharded one is a collective):
    a failure on any rank fails this stage, not a later one."""
    metrics, *_ = resolve([summary, *peers])
    return numeric_metrics(metrics)


@task(name="prepare_batch", task_run_name="prepare_batch[iter={iteration}]", **STAGE_TASK)
def prepare_batch(
    iteration: int,
    summary: Any,
    installs: Sequence[Any],
    experience: Any = None,
    samples_key: str | None = None,
    peers: Sequence[Any] = (),
) -> tuple[str, dict[str, float]]:
    """Done when the targets are frozen, every trainer rank holds them (and every
    other policy rank has run the same forward, `peers`, S-SCALE-1) and the replay
    role has written the iteration's experience file (S-OPS-3), a few of whose samples
    this task run shows as a table. Returns the batch id all ranks agree on, which
    their receipts must quote (S-FLOW-5)."""
    metrics, *installed = resolve([summary, *installs])
    resolve(list(peers))
    if experience is not None:
        publish_samples(resolve([experience])[0], samples_key)
    batch_ids = {held["batch_id"] for held in installed}
    if len(batch_ids) != 1:
        raise RuntimeError(
            f"iteration {iteration}: trainer ranks hold different batches {sorted(batch_ids)} (S-FLOW-5)"
        )
    return batch_ids.pop(), numeric_metrics(metrics)


def check_receipts(receipts: Sequence[TrainReceipt], batch_id: str, iteration: int) -> None:
    """Every rank of a trainable role must name the same whole batch, the one the
    controller handed out, and stand at the same optimizer step (S-FLOW-5)."""
    for receipt in receipts:
        if receipt.batch_id != batch_id:
            raise RuntimeError(
                f"iteration {iteration}: {receipt.role} rank {receipt.rank} trained on batch "
                f"{receipt.batch_id}, the controller handed out {batch_id}"
            )
    steps = {receipt.rank: receipt.optimizer_step for receipt in receipts}
    if len(set(steps.values())) > 1:
        raise RuntimeError(
            f"iteration {iteration}: {receipts[0].role} ranks disagree on the optimizer step {steps}; "
            "their weights are no longer the same"
        )


def _trained(iteration: int, receipts: Sequence[Any], batch_id: str) -> dict[str, float]:
    """Rank 0's metrics, which (summed over all ranks' shards) describe the whole update."""
    resolved: list[TrainReceipt] = resolve(receipts)
    check_receipts(resolved, batch_id, iteration)
    log_metrics(resolved[0].metrics)
    return dict(resolved[0].metrics)


@task(name="train_policy", task_run_name="train_policy[iter={iteration}]", **STAGE_TASK)
def train_policy(iteration: int, receipts: Sequence[Any], batch_id: str) -> dict[str, float]:
    return _trained(iteration, receipts, batch_id)


@task(name="train_critic", task_run_name="train_critic[iter={iteration}]", **STAGE_TASK)
def train_critic(iteration: int, receipts: Sequence[Any], batch_id: str, parks: Sequence[Any] = ()) -> dict[str, float]:
    """During critic warmup the policy's only call is its park, so this, the
    iteration's last task, also waits for it: the next rollout must find the shared
    GPU free (S-RUN-4)."""
    metrics = _trained(iteration, receipts, batch_id)
    return {**metrics, **park_metrics(resolve(parks))}


def park_metrics(parked: Sequence[dict[str, float]]) -> dict[str, float]:
    """Rank 0's park cost; `{}` wherever the policy does not park."""
    return dict(parked[0]) if parked else {}


@task(name="weight_sync", task_run_name="weight_sync[iter={iteration}]", **STAGE_TASK)
def weight_sync(
    iteration: int, loaded: Sequence[Any], policy_version: Any, follows: Sequence[Any], parks: Sequence[Any]
) -> tuple[int, dict[str, float]]:
    """The policy's new weights went to every rollout engine actor to actor through
    the object store, never through this process (S-FLOW-6). Done once every engine
    and every policy rank holds the new version and every policy rank has parked."""
    results = resolve([*loaded, policy_version, *follows, *parks])
    version = results[len(loaded)]
    parked = results[len(loaded) + 1 + len(follows):]
    metrics = {**results[0], **park_metrics(parked)}  # engine 0's load metrics
    log_metrics(metrics)
    return int(version), metrics


@task(name="evaluate", task_run_name="evaluate[iter={iteration}]", **STAGE_TASK)
def evaluate(iteration: int, generate_summary: Any, scores: Any) -> dict[str, float]:
    """Held-out evaluation of the policy after this iteration's update (iteration 0:
    the starting policy), generated on the rollout engine and scored with the run's
    reward; its `val/*` metrics join the iteration's record (S-OPS-2)."""
    return numeric_metrics(*resolve([generate_summary, scores]))
