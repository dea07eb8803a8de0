"""Metrics records as a run writes them to metrics.jsonl, for tests of what is built
from them (the history table, the summary, the curve)."""

from __future__ import annotations


def iteration_metrics(
    iteration: int, reward: float, kl: float, warmup: bool = False, version: int | None = None
) -> dict:
    """One iteration's record; a warmup iteration has no policy loss and no weight sync."""
    record = {
        "iteration": iteration,
        "train/reward_mean": reward,
        "train/kl": kl,
        "train/value_loss": 0.05,
        "train/actor_warmup": 1.0 if warmup else 0.0,
        "train/policy_version": float(iteration if version is None else version),
        "time/data_seconds": 0.01,
        "time/rollout_seconds": 0.123456,
        "time/train_seconds": 0.5,
        "time/iteration_seconds": 0.9,
    }
    if not warmup:
        record["train/policy_loss"] = -0.0347
        record["time/weight_sync_seconds"] = 0.02
    return record
