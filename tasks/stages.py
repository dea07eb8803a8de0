"""What each stage of one PPO iteration checks and reports (S-FLOW-1), with no Prefect
and no Ray: the in-process runner calls these functions as they are, and the flow runs
each as the body of its Prefect task (tasks/prefect_tasks.py), which first waits for
the actor calls in its arguments. A body therefore always receives plain values.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any, Callable, Sequence

from contracts.faults import REWARD_EVENTS
from contracts.rollout_faults import FAULT_EVENTS, describe_event
from contracts.trajectory import TrainReceipt

stage_log: ContextVar[logging.Logger | logging.LoggerAdapter] = ContextVar(
    "stage_log", default=logging.getLogger("ppo.stages")
)
"""Where a stage's metrics line goes: the task run's logger when Prefect runs the stage
(prints inside actors never reach the UI), a plain logger in process."""

samples_view: ContextVar[Callable[[Any], None] | None] = ContextVar("samples_view", default=None)
"""Where prepare_batch shows a few samples of its batch: a table in the task run when
Prefect runs the stage (S-OPS-3); nowhere in process."""


def log_metrics(metrics: dict[str, Any]) -> None:
    if metrics:
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items()))
        stage_log.get().info(shown)


def numeric_metrics(*summaries: dict[str, Any]) -> dict[str, float]:
    """Merge stage summaries into metrics. Identities (the replay's batch id) are
    logged, not recorded: metrics are numbers."""
    merged = {k: v for summary in summaries for k, v in summary.items()}
    log_metrics(merged)
    return {k: v for k, v in merged.items() if isinstance(v, (int, float))}


def rollout(iteration: int, data_summary: dict, rollout_summary: dict) -> dict[str, float]:
    """Done when the data cursor handed out the batch and the engines generated it.
    The data call is folded in here: a task of its own would cost far more in Prefect
    bookkeeping than its compute. An engine lost and replaced on the way is logged
    here, a WARNING, and the task still completes (S-ELASTIC-2)."""
    summary = dict(rollout_summary)
    for event in summary.pop(FAULT_EVENTS, ()):  # the pool's records, put into words here only
        stage_log.get().log(*describe_event(event))
    return numeric_metrics(data_summary, summary)


def logged_events(summary: dict, key: str) -> dict:
    """`summary` without its `key` list of [level, message] events, which go to the
    stage's log (the UI's, for a task run: an actor's own log never reaches it)."""
    summary = dict(summary)
    for level, message in summary.pop(key, ()):
        stage_log.get().log(logging.WARNING if level == "warning" else logging.INFO, message)
    return summary


def reward(iteration: int, reward_summary: dict, replay_summary: dict) -> dict[str, float]:
    """Done when every completion is scored and the replay buffer has named the batch;
    the first completions a raising reward was scored 0 on are logged with their rows
    (rl.reward.on_error=zero, S-BYO-3)."""
    return numeric_metrics(logged_events(reward_summary, REWARD_EVENTS), replay_summary)


def reference_score(iteration: int, summary: dict) -> dict[str, float]:
    """Done when every reference rank has scored (a sharded forward is a collective:
    the runner waits for the other ranks too)."""
    return numeric_metrics(summary)


def critic_predict(iteration: int, summary: dict) -> dict[str, float]:
    """Done when every critic rank has run the forward: the runner waits for the other
    ranks too, so a failure on any rank fails this stage, not a later one."""
    return numeric_metrics(summary)


def prepare_batch(iteration: int, summary: dict, installs: Sequence[dict]) -> tuple[str, dict[str, float]]:
    """Done when the targets are frozen and every trainer rank holds them (the runner
    also waits for every other policy rank's same forward). Returns the batch id all
    ranks agree on, which their receipts must quote. The experience file is written
    meanwhile, off this path: `train_critic` waits for it (S-OPS-3)."""
    batch_ids = {held["batch_id"] for held in installs}
    if len(batch_ids) != 1:  # S-FLOW-5
        raise RuntimeError(
            f"iteration {iteration}: trainer ranks hold different batches {sorted(batch_ids)}"
        )
    return batch_ids.pop(), numeric_metrics(summary)


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


def _trained(iteration: int, receipts: Sequence[TrainReceipt], batch_id: str) -> dict[str, float]:
    """Rank 0's metrics, which (summed over all ranks' shards) describe the whole update."""
    check_receipts(receipts, batch_id, iteration)
    log_metrics(receipts[0].metrics)
    return dict(receipts[0].metrics)


def train_policy(
    iteration: int, receipts: Sequence[TrainReceipt], batch_id: str, experience: Any = None
) -> dict[str, float]:
    """Without a critic (a critic-free estimator, S-OPT-2) this is the iteration's last
    train stage, and waits for the experience file as `train_critic` otherwise does."""
    _show_samples(experience)
    return _trained(iteration, receipts, batch_id)


def train_critic(
    iteration: int, receipts: Sequence[TrainReceipt], batch_id: str, parks: Sequence[dict] = (), experience: Any = None
) -> dict[str, float]:
    """During critic warmup the policy's only call is its park, so this, the
    iteration's last task, also waits for it: the next rollout must find the shared
    GPU free (S-RUN-4). It also waits for the iteration's experience file, written by
    the replay role while the trainers update; the commit comes after it (S-OPS-3)."""
    _show_samples(experience)
    return {**_trained(iteration, receipts, batch_id), **park_metrics(parks)}


def _show_samples(experience: Any) -> None:
    """A few of the experience file's samples, where `samples_view` says (S-OPS-3)."""
    show = samples_view.get()
    if experience is not None and show is not None:
        show(experience)


def park_metrics(parked: Sequence[dict[str, float]]) -> dict[str, float]:
    """Rank 0's park cost; `{}` wherever the policy does not park."""
    return dict(parked[0]) if parked else {}


def weight_sync(
    iteration: int, loaded: Sequence[dict], policy_version: int, parks: Sequence[dict]
) -> tuple[int, dict[str, float]]:
    """Done once every engine and every policy rank holds the new version (the runner
    also waits for every other policy rank to follow it) and every policy rank has
    parked. The weights went actor to actor, never through the controller (S-FLOW-6)."""
    metrics = {**loaded[0], **park_metrics(parks)}  # engine 0's load metrics
    log_metrics(metrics)
    return int(policy_version), metrics


def evaluate(iteration: int, generate_summary: dict, scores: dict) -> dict[str, float]:
    """Held-out evaluation of the policy after this iteration's update (iteration 0:
    the starting policy); its `val/*` metrics join the iteration's record (S-OPS-2)."""
    return numeric_metrics(generate_summary, logged_events(scores, REWARD_EVENTS))
