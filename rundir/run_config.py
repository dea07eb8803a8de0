"""The config a run trains with, resolved the same way by the command line (before
anything starts) and by the flow: light to import, so the command line can start the
run's services before it imports the flow."""

from __future__ import annotations

import os
from typing import Any

from configs.loading import load_config, profile_dirs
from configs.schema import PPOConfig

DEFAULT_PROFILE = "configs/ppo_tiny_cpu.py"


def resolve_config(
    profile: str, overrides: list[str] | None, critic_warmup_iterations: int | None, run_name: str | None
) -> PPOConfig:
    """Profile, then overrides, then the flow's own parameters (which win, so the
    Prefect form's fields mean what they say). Paths become absolute because actors
    do not share this process's working directory."""
    extra = list(overrides or [])
    if critic_warmup_iterations is not None:
        extra.append(f"rl.critic_warmup_iterations={critic_warmup_iterations}")
    if run_name:
        extra.append(f"job.name={run_name}")
    config = load_config(profile, extra, allowed_dirs=profile_dirs())  # S-SEC-2: a parameter runs no arbitrary file
    updates: dict[str, Any] = {}
    if "://" not in config.job.output_root:
        updates["job"] = config.job.model_copy(update={"output_root": os.path.abspath(config.job.output_root)})
    if config.model.tiny is not None and "://" not in config.model.path:
        updates["model"] = config.model.model_copy(update={"path": os.path.abspath(config.model.path)})
    if config.rl.data.path and "://" not in config.rl.data.path:
        data = config.rl.data.model_copy(update={"path": os.path.abspath(config.rl.data.path)})
        updates["rl"] = config.rl.model_copy(update={"data": data})
    return config.model_copy(update=updates)
