"""The stages of one PPO iteration, listed once (S-FLOW-1).

Everything that names a stage (the Prefect tasks, the iteration's `time/*` metrics,
the history table's column order, the benchmarks and the tests) imports these
tuples, so a stage added or renamed in one place cannot silently go missing in
another. Nothing here imports Prefect or Ray.
"""

from __future__ import annotations

ITERATION_TASKS: tuple[str, ...] = (
    "rollout",
    "reward",
    "reference_score",
    "critic_predict",
    "prepare_batch",
    "train_policy",
    "train_critic",
    "weight_sync",
    "evaluate",
    "commit",
)
"""One Prefect task run per stage and iteration, named `<stage>[iter=N]`, in the order
an iteration runs them. `train_policy` and `weight_sync` are skipped during critic
warmup (S-CW-5), `evaluate` runs on the rl.validation cadence only (and as
`evaluate[iter=0]` before training, S-OPS-2), `commit` on the save cadence only."""

BLOCK_FLOW = "ppo-iterations"
"""The flow of a block subflow run (flows/blocks.py): what the history compactor of a
served stack looks for (deployments/history_compactor.py)."""

EVALUATE = "evaluate"
ROLLOUT = "rollout"

SAVE_ARTIFACT_TASK = "save_artifact"  # a weights-only cadence save (S-CKPT-5), in place of `commit`
EXPORT_TASK = "export"  # once, after the final boundary

TRAIN = "train"
"""Both trainers' tasks run concurrently; `time/train_seconds` is the pair's wall time."""

TIMED_STAGES: tuple[str, ...] = (
    "rollout",
    "reward",
    "reference_score",
    "critic_predict",
    "prepare_batch",
    TRAIN,
    "weight_sync",
    EVALUATE,
    "commit",
    SAVE_ARTIFACT_TASK,
)
"""Stages with a `time/<stage>_seconds` metric, in iteration order."""


def time_key(stage: str) -> str:
    return f"time/{stage}_seconds"
