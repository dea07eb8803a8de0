"""The config-only checks every launch path makes, in one place (S-RUN-3).

The CLI, a deployment's flow run and `--validate-manifest` all call `config_problems`
through the one pre-flight (rundir/preflight_checks.py), so they refuse the same configs with
the same `key: message` lines; single-section rules are the schema's own validators.
Nothing here imports Prefect, Ray or torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from environments.preflight import environment_problems
from models.tiny_spec import tiny_spec_differences
from configs.callables import check_callable_module, code_reference_keys, value_at
from configs.schema import PPOConfig
from configs.tracker_packages import missing_tracker_packages, tracker_message
from models.lora_targets import TARGETS_KEY, checkpoint_module_names, targets_message, unmatched_targets
from placement.plan import PlacementPlan, placement_problems, plan_placement
from placement.mesh import mesh_problems
from weights.nixl_package import unavailable_reason


@dataclass(frozen=True)
class Problem:
    key: str  # the dotted config key the user should change
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def config_problems(config: PPOConfig, plan: PlacementPlan | None = None) -> list[Problem]:
    """Every cross-field rule of a config, whatever machine checks it: placement vs.
    the declared devices (S-RUN-4, S-RUN-5), shards that split evenly, the update plan,
    and user callables that can be found."""
    plan = plan_placement(config) if plan is None else plan
    problems = [Problem(key, message) for key, message in placement_problems(plan, config)]
    problems += [Problem(key, message) for key, message in mesh_problems(plan)]  # S-SCALE-1
    rl = config.rl
    if rl.samples_per_iteration % rl.minibatch_size:
        problems.append(Problem(
            "rl.minibatch_size",
            f"is {rl.minibatch_size}, which does not divide {rl.named_samples()}; the update plan needs whole "
            "minibatches",
        ))
    if rl.micro_batch_tokens is not None:  # S-PATH-3
        response_budget = rl.generation_budget
        longest = "rl.env.max_episode_tokens" if rl.env is not None else "rl.rollout.max_new_tokens"
        if rl.micro_batch_tokens <= response_budget:
            problems.append(Problem(
                "rl.micro_batch_tokens",
                f"is {rl.micro_batch_tokens}, but one row can hold {response_budget} response tokens "
                f"({longest}) plus its prompt: a micro-batch must hold the longest row; set it above "
                f"{response_budget} plus the longest prompt (a longer row is refused when the update meets it)",
            ))
    engine_timeout, stage_timeout = rl.rollout.engine_timeout_seconds, rl.stage_timeout_seconds
    if engine_timeout is not None and stage_timeout is not None and engine_timeout >= stage_timeout:  # S-ELASTIC-1
        problems.append(Problem(
            "rl.rollout.engine_timeout_seconds",
            f"is {engine_timeout:g}, not below rl.stage_timeout_seconds={stage_timeout:g}: a hung engine would fail "
            "the rollout stage before it could be replaced; set it well below (null: a quarter of the stage's)",
        ))
    if config.grid.grouping != "per_role":  # S-XFER-2
        problems.append(Problem(
            "grid.grouping",
            f"is {config.grid.grouping!r}, but PPO runs the policy, rollout, reference and critic as actor groups "
            "of their own; set grid.grouping=per_role (the default)",
        ))
    if rl.rollout.max_staleness and plan.mode == "colocated" and plan.total_gpus > 0:  # S-ASYNC-1
        problems.append(Problem(
            "rl.rollout.max_staleness",
            f"is {rl.rollout.max_staleness}, which generates the next batch while the policy trains, but "
            "grid.gpu_placement=colocated puts the rollout engines on the policy's GPUs; set "
            "grid.gpu_placement=disaggregated (with grid.rollout_gpus) or rl.rollout.max_staleness=0",
        ))
    problems += lora_problems(config)
    problems += [Problem(key, message) for key, message in tiny_spec_differences(config.model)]
    problems += [Problem(key, message) for key, message in environment_problems(config)]  # S-ENV-1
    # Code named in the config must at least be findable before any worker starts;
    # the values already passed the trust check, so finding their parents is safe.
    missing = missing_tracker_packages(config.job.trackers)
    if missing:
        problems.append(Problem("job.trackers", tracker_message(missing).removeprefix("job.trackers: ")))
    for key in code_reference_keys(type(config)):
        path = value_at(config, key)
        if path is not None:
            try:
                check_callable_module(path, key=key)
            except ValueError as error:
                problems.append(Problem(key, str(error).removeprefix(f"{key}: ")))
    return problems


def lora_problems(config: PPOConfig) -> list[Problem]:
    """Adapters the model cannot take (S-LORA-1), from files alone: target modules that
    name no module of a local checkpoint (a model not yet on disk is checked by the
    trainer roles when they add the adapters, with the same message), and a
    vision-language model, whose critic and vision tower have no LoRA path here."""
    lora = config.model.lora
    if not lora.enabled:
        return []
    config_file = Path(config.model.path) / "config.json"
    vision = (config.model.tiny is not None and config.model.tiny.vision is not None) or (
        config_file.is_file() and "vision_config" in json.loads(config_file.read_text())
    )
    if vision:
        return [Problem(
            "model.lora.rank",
            f"is {lora.rank}, but LoRA adapters are supported for text-only models; {config.model.path} is a "
            "vision-language model: set model.lora.rank=0",
        )]
    names = checkpoint_module_names(config.model.path)
    missing = [] if names is None else unmatched_targets(lora.target_modules, names)
    return [Problem(TARGETS_KEY, targets_message(missing, names))] if missing else []


def joins_cluster(config: PPOConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The Ray address a launch would join, or None when it starts its own Ray here."""
    env = os.environ if environ is None else environ
    return config.grid.ray_address or env.get("RAY_ADDRESS") or None


def visible_gpus(environ: Mapping[str, str] | None = None, driver_dir: str = "/proc/driver/nvidia/gpus") -> int:
    """GPUs a Ray started on this machine would see, without importing torch or Ray:
    CUDA_VISIBLE_DEVICES when set (as Ray honours it), else the NVIDIA driver's list."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        return len([d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip() and d.strip() != "-1"])
    directory = Path(driver_dir)
    return len(list(directory.iterdir())) if directory.is_dir() else 0


def machine_problems(
    config: PPOConfig, plan: PlacementPlan | None = None, *, environ: Mapping[str, str] | None = None,
    gpus: int | None = None,
) -> list[Problem]:
    """A placement that cannot fit the machine a local launch would start Ray on.
    Joining a cluster is checked when its placement groups are reserved instead."""
    if config.rl.weight_sync_transport == "nixl":  # S-XFER-1
        reason = unavailable_reason()
        if reason is not None:
            return [Problem("rl.weight_sync_transport", f"is 'nixl', but {reason}; or use object_store")]
    if joins_cluster(config, environ):
        return []
    plan = plan_placement(config) if plan is None else plan
    if plan.spreads_over_nodes:
        return [Problem(
            "grid.num_nodes",
            f"is {plan.num_nodes} but no Ray cluster is named (RAY_ADDRESS or grid.ray_address): a Ray started "
            "here is one node; join a cluster of that many nodes, or set grid.num_nodes=1",
        )]
    if not plan.uses_gpus:
        return []
    here = visible_gpus(environ) if gpus is None else gpus
    if here >= plan.total_gpus:
        return []
    return [Problem(
        "grid.gpus_per_node",
        f"is {plan.gpus_per_node}: the {plan.mode} placement needs {plan.total_gpus} GPUs, but this machine has {here} "
        "and no Ray cluster is named (RAY_ADDRESS or grid.ray_address); join a cluster with enough GPUs, or run the "
        "CPU profile (configs/ppo_tiny_cpu.py)",
    )]
