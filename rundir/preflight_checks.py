"""The pre-flight, in one list (S-RUN-3, S-BYO-2): every check a launch and
`--validate-manifest` make before Ray starts, in the order they run, each with what it
checks, on which keys, and the function that does it, whatever module holds that.

`check_manifest` runs `MANIFEST_CHECKS` and nothing else, so a new check is one entry
here (tests/pure/test_preflight_checks.py fails on a check called outside the list).
The rules of a single config section are the schema's own validators, run when the
config is loaded, before any of these: `schema_validators()` lists them from
configs/schema.py itself. `python -m rundir.preflight_checks` prints both tables.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from configs.loading import ConfigError
from configs.schema import PPOConfig
from placement.plan import plan_placement
from rundir.run_checks import (
    ManifestReport, ManifestRun, check_checkpoints, check_critic_start, check_memory, check_model, check_openings,
    check_options, check_placement, check_reward, check_served_reward_text, check_training_data,
    check_validation_data, describe_run, describe_update, note_profile_folder,
)


@dataclass(frozen=True)
class PreflightCheck:
    name: str
    checks: str  # what it checks, as a reader of the manifest would ask
    keys: str  # the keys (or files) it reads
    body: Callable[[ManifestRun], None]  # fills the run's report: summary lines, notes, problems


# These words are printed (`python -m rundir.preflight_checks`), so they cite no spec id;
# docs/launch.md's table of the checks cites them.


MANIFEST_CHECKS: tuple[PreflightCheck, ...] = (
    PreflightCheck(
        "run", "the `run:` line: the run's name, iterations, batch and critic warmup",
        "job.name, rl.max_steps, rl.batch_size, rl.rollout.samples_per_prompt, rl.critic_warmup_iterations",
        describe_run,
    ),
    PreflightCheck(
        "placement",
        "the cross-field rules of rundir/preflight.py `config_problems` (placement vs. declared devices, meshes, "
        "whole minibatches, micro-batch tokens, engine vs. stage timeout, grouping, staleness vs. colocation, LoRA "
        "targets, a tiny model's spec, the environment's episodes, tracker packages, user callables found), then "
        "this machine's devices and Ray address (`machine_problems`: an error at launch, a note in a manifest)",
        "grid.*, rl.minibatch_size, rl.micro_batch_tokens, rl.rollout.engine_timeout_seconds, "
        "rl.stage_timeout_seconds, rl.rollout.max_staleness, model.lora.*, model.tiny, rl.env.*, job.trackers, "
        "every key naming code",
        check_placement,
    ),
    PreflightCheck(
        "model",
        "the model's config.json and folder (files/model_folder.py): weights, architecture, tokenizer files and size, "
        "EOS/pad; heads vs. tensor parallel size; the context vs. the generation budget; the reward model's folder",
        "model.path, model.tiny, grid.rollout_tensor_parallel_size, rl.rollout.max_new_tokens, rl.env.*, "
        "rl.reward.model.*",
        check_model,
    ),
    PreflightCheck(
        "update", "the `loss:`, `micro-batches:` and `advantages:` lines when not the defaults",
        "rl.loss_aggregation, rl.micro_batch_tokens, rl.advantage_estimator",
        describe_update,
    ),
    PreflightCheck(
        "critic start", "a critic started from another folder reads the policy's token ids",
        "model.critic_path, rl.reward.model.path",
        check_critic_start,
    ),
    PreflightCheck(
        "reward", "the terminal rule or callable resolves; the data checks then read what it needs",
        "rl.reward.terminal, rl.reward.terminal_callable, job.trusted_modules",
        check_reward,
    ),
    PreflightCheck(
        "memory", "the `memory:` line of each device group (placement/memory_estimate.py)",
        "model.*, grid.*, rl.rollout.gpu_memory_utilization, grid.gpu_memory_gib",
        check_memory,
    ),
    PreflightCheck(
        "training data",
        "every row read and projected as the data role does, against the reward's needs; conversation rows "
        "rendered through the chat templates",
        "rl.data.*, data_packer.*, rl.reward.*",
        check_training_data,
    ),
    PreflightCheck(
        "openings", "the project's own environments' episode openings fit the episode (first rows)",
        "rl.env.factory, rl.env.max_episode_tokens, rl.env.max_turn_tokens, model.path",
        check_openings,
    ),
    PreflightCheck(
        "validation data", "the held-out rows, as the training rows, under their own keys",
        "rl.validation.data.*",
        check_validation_data,
    ),
    PreflightCheck(
        "served reward text",
        "a served reward model without a local folder is sent plain text: conversation prompts are refused",
        "rl.reward.model.url, rl.reward.model.path",
        check_served_reward_text,
    ),
    PreflightCheck(
        "checkpoints",
        "the output root is a writable folder; what a launch would resume from, refused as the launch would refuse "
        "it",
        "job.output_root, job.name, model.*, rl.max_steps, rl.critic_warmup_iterations, rl.rollout.max_staleness",
        check_checkpoints,
    ),
    PreflightCheck(
        "options", "options that contradict each other, and harmless oddities as notes",
        "rl.save_every, rl.save_final, rl.max_steps, rl.rollout.engine, rl.colocated_offload, grid.gpus_per_node",
        check_options,
    ),
    PreflightCheck(
        "profile folder", "files beside the profile named like a module (notes)", "the profile's folder",
        note_profile_folder,
    ),
)


def check_manifest(
    config: PPOConfig, *, environ: dict[str, str] | None = None, launching_here: bool = False,
    profile: str | Path | None = None,
) -> ManifestReport:
    """Every check that needs no worker, in MANIFEST_CHECKS' order; collects all problems
    instead of stopping.

    `launching_here`: the launch's own pre-flight, on the machine it starts Ray on, so
    a placement this machine cannot hold is a problem (a manifest checked from a laptop
    notes it); the launch then finds its resume point itself (rundir/resume.py), which
    the manifest calls here so that it refuses what the launch refuses (S-BYO-2).
    `profile`: the profile file, whose folder's file names are checked (notes only)."""
    run = ManifestRun(
        config, plan_placement(config), ManifestReport(), os.environ if environ is None else environ,
        launching_here, profile,
    )
    for check in MANIFEST_CHECKS:
        check.body(run)
    return run.report


def require_runnable(
    config: PPOConfig, *, environ: dict[str, str] | None = None, profile: str | Path | None = None
) -> ManifestReport:
    """The launch's pre-flight (CLI and deployment alike): raise ConfigError naming
    every problem that would stop this run, before Prefect or Ray start; else the
    report, whose packer line and notes on the profile's folder the launch prints."""
    report = check_manifest(config, environ=environ, launching_here=True, profile=profile)
    if report.problems:
        raise ConfigError([str(problem) for problem in report.problems])
    return report


# --- the schema's own validators ---------------------------------------------------


def _sections(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _sections(argument)


def schema_validators(model: type[BaseModel] = PPOConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(section, validator, what it checks) for every validator of the schema, read from
    the pydantic models themselves: the section's dotted key (`rl.env`), the validator's
    name and its docstring's first line (or the fields a field validator checks)."""
    rows, decorators = [], model.__pydantic_decorators__
    for name, found in [*decorators.field_validators.items(), *decorators.model_validators.items()]:
        doc = " ".join((found.func.__doc__ or "").split()).split(". ")[0].removesuffix(".")
        fields = getattr(found.info, "fields", ())
        what = doc or (f"the key(s) {', '.join(fields)}" if fields else "see configs/schema.py")
        rows.append((prefix.rstrip(".") or "(top)", name, what))
    seen: set[type[BaseModel]] = set()
    for field_name, field in model.model_fields.items():
        for section in _sections(field.annotation):
            if section not in seen:
                seen.add(section)
                rows += schema_validators(section, f"{prefix}{field_name}.")
    return rows


def render() -> str:
    """Both tables, as markdown."""
    lines = ["| # | check | what | keys | body |", "| --- | --- | --- | --- | --- |"]
    for number, check in enumerate(MANIFEST_CHECKS, 1):
        body = f"{check.body.__module__}.{check.body.__name__}"
        lines.append(f"| {number} | {check.name} | {check.checks} | {check.keys} | `{body}` |")
    lines += ["", "| section | schema validator | what |", "| --- | --- | --- |"]
    lines += [f"| `{section}` | `{name}` | {what} |" for section, name, what in schema_validators()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
