"""What a run tells its reader: start-up progress on the terminal and in the flow run's
log, one line per iteration, and the summary the flow returns (the reward's rise, the
last boundary, the exported model)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger

from configs.schema import PPOConfig
from flows.stopping import Stopped
from rundir.run_outputs import RunPaths, read_metrics

if TYPE_CHECKING:
    from flows.flow_runner import FlowRunner
    from processes.actors import RoleHandles


def say(line: str) -> None:
    """Start-up progress: on the terminal of a CLI run, in the flow run's log in the UI."""
    print(line, flush=True)
    get_run_logger().info(line)


def model_build_line(config: PPOConfig) -> str | None:
    """The first run of a tiny profile builds its model inside the role actors (minutes
    when it is pre-trained), while the terminal would otherwise say nothing."""
    tiny, folder = config.model.tiny, Path(config.model.path)
    if tiny is None or (folder / "config.json").is_file():
        return None
    taught = (
        f", pre-trained on {tiny.pretrain_task} for {tiny.pretrain_steps} steps"
        if tiny.pretrain_task != "none" and tiny.pretrain_steps > 0 else ""
    )
    return f"model: building the tiny model in {folder}{taught} (once: the folder is the cache); the roles start after"


def run_summary(
    config: PPOConfig,
    paths: RunPaths,
    roles: RoleHandles,
    runner: FlowRunner,
    policy_version: int,
    last_boundary: str | None,
    exported,
) -> dict[str, Any]:
    updates = runner.get(roles.policy.update_counts.remote())
    return {
        "run_name": config.job.name,
        "run_dir": paths.run_dir,
        "iterations": config.rl.max_steps,
        "policy_version": policy_version,
        "last_boundary": last_boundary,
        "final_model": exported,
        # Observed from the policy itself: no optimizer step and no published version.
        "actor_untouched": updates["optimizer_step"] == 0 and updates["policy_version"] == 0,
        **reward_rise(records := read_metrics(paths.metrics)),
        **held_out_rise(records),
    }


def reward_rise(records: list[dict[str, Any]], window: int = 10) -> dict[str, float | None]:
    """First-`window` vs last-`window` mean reward over the whole run (resumed parts
    included): the one number that says whether the policy learned."""
    # The before-training evaluation's row 0 has no training reward.
    ordered = sorted(records, key=lambda r: r["iteration"])
    rewards = [r["train/reward_mean"] for r in ordered if "train/reward_mean" in r]
    if not rewards:
        return {"first_reward_mean": None, "last_reward_mean": None, "reward_window": window}
    # Disjoint windows when the run is short, so "rise" compares different iterations.
    window = max(1, min(window, len(rewards) // 2))
    first = sum(rewards[:window]) / window
    last = sum(rewards[-window:]) / window
    return {"first_reward_mean": first, "last_reward_mean": last, "reward_window": window}


# The held-out figure a rise is told in, first found first: the rule's verdict, else the
# reward model's raw score. Never `val/reward_mean` where a reward model normalises: its
# first evaluation (no moments yet) and its later ones are on different scales.
HELD_OUT_FIGURES = (
    ("val/fraction_correct", "fraction correct by the rule"),
    ("val/model_raw_mean", "raw reward-model score"),
    ("val/reward_mean", "reward"),
)


def held_out_rise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The first and the last held-out evaluation (S-OPS-2): the training reward is
    sampled on rows the policy trains on, this one is what it does on rows it never saw.
    Both ends read the same metric, named in `val_metric`, so the rise compares one scale."""
    for metric, meaning in HELD_OUT_FIGURES:
        evaluated = sorted((r["iteration"], r[metric]) for r in records if metric in r)
        if len(evaluated) >= 2:
            break
    else:
        return {}
    (first_iteration, first), (last_iteration, last) = evaluated[0], evaluated[-1]
    return {"first_val_reward": first, "first_val_iteration": first_iteration,
            "last_val_reward": last, "last_val_iteration": last_iteration,
            "val_metric": metric, "val_metric_meaning": meaning}


def progress_line(config: PPOConfig, record: dict[str, Any]) -> str:
    evaluated = validation_text(record)
    if "train/reward_mean" not in record:  # iteration 0: the starting policy's evaluation only
        return f"iter {record['iteration']:>4}/{config.rl.max_steps}  before training: {evaluated.strip()}"
    policy_loss = record.get("train/policy_loss")
    value_loss = record.get("train/value_loss")  # none without a critic (S-OPT-2)
    phase = "critic-warmup" if record["train/actor_warmup"] else f"pv={int(record['train/policy_version'])}"
    return (
        f"iter {record['iteration']:>4}/{config.rl.max_steps}  reward {record['train/reward_mean']:.3f}  "
        f"policy_loss {'   -   ' if policy_loss is None else f'{policy_loss:+.4f}'}  "
        + ("" if value_loss is None else f"value_loss {value_loss:.4f}  ")
        + f"kl {record['train/kl']:+.4f}  {phase}  "
        f"{record['time/iteration_seconds']:.2f}s{evaluated}"
    )


def validation_text(record: dict[str, Any]) -> str:
    if "val/reward_mean" not in record:
        return ""
    exact = record.get("val/exact_match")
    return f"  val reward {record['val/reward_mean']:.3f}" + ("" if exact is None else f" exact {exact:.3f}")


def stopped_summary(config: PPOConfig, paths: RunPaths, stopped: Stopped) -> dict[str, Any]:
    """The summary of a run stopped before its iterations (start-up, restore)."""
    return {"run_name": config.job.name, "run_dir": paths.run_dir, "iterations": config.rl.max_steps,
            "last_boundary": stopped.boundary, "final_model": None, "stopped": dataclasses.asdict(stopped)}
