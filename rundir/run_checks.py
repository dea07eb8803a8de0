"""The pre-flight's checks: check a whole run before anything is allocated (S-RUN-3,
S-BYO-2). rundir/preflight_checks.py lists them in the order they run, each a function
of one ManifestRun; `--validate-manifest` prints the report (cli/manifest.py); every
launch, on the command line and in a deployment's flow run, refuses with it before Ray
starts (flows/launch.py).

A GPU node's hours cost money, so every mistake the config, the data and the model's
config file can show is found here, on a laptop, all at once (each problem starting
with its dotted key), not one per launch. It never starts or imports Ray, loads weights
or downloads; docs/launch.md section 1 lists the checks.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from configs.callables import PROJECT_CALLABLE_MODULES, within
from algorithm.rewards import SHARED_RULE_NAMES, RewardConfigError, TerminalMatcher, resolve_terminal
from configs.profile_folder import shadowing_notes
from configs.schema import DataConfig, PPOConfig
from data.chat_render import first_rows_by_roles, render_each_sequence, render_prompt, render_scored, role_sequence
from data.prompt_projection import (
    PromptError, conversation_without_template, project_prompt, project_reference, reference_key_for,
)
from rundir.preflight import Problem, config_problems, joins_cluster, machine_problems
from environments.preflight import OPENING_ROWS, episode_context_problems
from files.model_folder import (
    HEADS, HUB_ID, KV_HEADS, POSITIONS, QWEN_VL_MODEL_TYPES, cached_hub_file, check_model_folder, config_value,
    model_sizes,
)
from models.reward_model_folder import describe_shaping, reward_model_folder_problems
from placement.memory_estimate import estimate_memory, memory_lines, memory_notes
from placement.mesh import role_meshes
from placement.node_layout import describe_slots
from algorithm.advantage_estimators import advantage_estimator
from placement.plan import PlacementPlan, plan_placement


@dataclass
class ManifestReport:
    summary: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    data_rows: int | None = None  # rows read from rl.data.path (None for other sources)
    packer: str | None = None  # which DataPacker shapes the prompts, as the launch's first lines say it
    plain_text_prompts: bool = False  # the plain-text packer: a conversation prompt cannot be shaped
    profile_notes: list[str] = field(default_factory=list)  # files beside the profile named like a module
    conversation_prompt: str | None = None  # where the data's first conversation-shaped prompt is, and its column
    opening_rows: list[tuple[Any, str]] = field(default_factory=list)  # rl.data's first rows, for the openings

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, key: str, message: str) -> None:
        self.problems.append(Problem(key, message))

    def keys(self) -> list[str]:
        return [p.key for p in self.problems]


@dataclass
class ManifestRun:
    """What the checks of one pre-flight share (rundir/preflight_checks.py runs them in
    order): the config, its placement plan, the report they fill, where it is checked,
    and what the reward check hands the data checks (the resolved rule)."""

    config: PPOConfig
    plan: PlacementPlan
    report: ManifestReport
    environ: Mapping[str, str]
    launching_here: bool  # the launch's own pre-flight, on the machine it starts Ray on
    profile: str | Path | None = None
    matcher: TerminalMatcher | None = None  # set by check_reward
    reward_resolved: bool = False


def describe_run(run: ManifestRun) -> None:
    config = run.config
    run.report.summary.append(
        f"run: {config.job.name}, {config.rl.max_steps} iterations, batch {describe_batch(config)}, "
        f"critic warmup {config.rl.critic_warmup_iterations}"
    )


# --- placement ---------------------------------------------------------------------


def check_placement(run: ManifestRun) -> None:
    config, plan, report = run.config, run.plan, run.report
    report.problems.extend(config_problems(config, plan))
    for problem in machine_problems(config, plan, environ=run.environ):
        if run.launching_here:
            report.problems.append(problem)
            continue
        # A manifest checks a launch meant for another machine too (a 4-GPU node,
        # from a laptop): here it is a note; `python -m flows.ppo` refuses it.
        report.notes.append(f"{problem} (a launch on this machine would be refused)")
    devices = (
        f"{plan.gpus_per_node} GPU(s) x {plan.num_nodes} node(s)"
        if plan.uses_gpus
        else "CPU only (grid.gpus_per_node=0)"
    )
    offload = ""
    if plan.mode == "colocated" and plan.uses_gpus:
        offload = f"; colocated offload {'on' if plan.offload_active else 'off (rl.colocated_offload=false)'}"
    report.summary.append(f"placement: {plan.describe()} on {devices}{offload}")
    if plan.spreads_over_nodes:  # the plan's node for every group, before any node is contacted
        report.summary.append(f"nodes: {describe_slots(plan)} (slots map onto the cluster's alive nodes at launch)")
    ranks = {role: plan.ranks(role) for role in plan.trainer_roles}
    engines = plan.ranks("rollout")
    if max(ranks.values()) > 1 or engines > 1:
        report.summary.append(
            "data parallel: " + ", ".join(f"{role} {n} rank{'s' if n != 1 else ''}" for role, n in ranks.items())
            + f", rollout {engines} engine{'s' if engines != 1 else ''} (one actor each; trainers sharded with FSDP2; "
            "each engine generates a shard of every batch)"
        )
    for mesh in role_meshes(plan).values():
        report.summary.append(f"mesh: {mesh.describe()}")
    report.summary.append(f"weight sync: {describe_transport(config)}")
    if plan.uses_gpus:
        for group in plan.groups:
            if group.gpus == 0 and not {"policy", "rollout"} & set(group.roles):
                report.notes.append(f"{group.key}=0: the {'+'.join(group.roles)} runs on the host in this GPU run")
    address = joins_cluster(config, run.environ)
    if address:
        source = "grid.ray_address" if config.grid.ray_address else "RAY_ADDRESS"
        report.summary.append(f"ray: joins the cluster at {address} ({source}; not contacted by this check)")
        if config.grid.ray_num_cpus is not None:
            report.notes.append(
                "grid.ray_num_cpus only sizes a locally started Ray; it is ignored when joining a cluster"
            )
    else:
        cpus = config.grid.ray_num_cpus if config.grid.ray_num_cpus is not None else "all"
        report.summary.append(f"ray: starts a local Ray at launch (num_cpus={cpus}); backend {config.grid.backend}")


# --- model -------------------------------------------------------------------------


def check_model(run: ManifestRun) -> None:
    config, plan, report = run.config, run.plan, run.report
    model_config = _read_model_config(config, report)
    rollout = config.rl.rollout
    report.summary.append(describe_rollout(config))
    if model_config is None:
        return
    heads = config_value(model_config, *HEADS)
    kv_heads = config_value(model_config, *KV_HEADS) or heads
    tp = plan.rollout_tensor_parallel_size
    if isinstance(heads, int) and heads % tp:
        report.problem(
            "grid.rollout_tensor_parallel_size",
            f"is {tp}, which does not divide the model's {heads} attention heads (model.path config.json)",
        )
    if isinstance(kv_heads, int) and tp > 1 and kv_heads % tp and tp % kv_heads:
        report.problem(
            "grid.rollout_tensor_parallel_size",
            f"is {tp}; the model's {kv_heads} key/value heads can neither be split over nor replicated on {tp} GPUs",
        )
    positions = config_value(model_config, *POSITIONS)
    # An episode's turns are bounded by rl.env.max_turn_tokens, and the episode by the
    # check below: rl.rollout.max_new_tokens is not used there, so it is not refused.
    if isinstance(positions, int) and config.rl.env is None and rollout.max_new_tokens >= positions:
        report.problem(
            "rl.rollout.max_new_tokens",
            f"is {rollout.max_new_tokens}, not below the model's context of {positions} positions (config.json; "
            "prompt plus completion must fit)",
        )
    if isinstance(positions, int) and config.rl.env is not None:  # S-BYO-5
        for key, message in episode_context_problems(config.rl.env, positions):
            report.problem(key, message)


def describe_batch(config: PPOConfig) -> str:
    """An iteration's batch: its prompts, and with several samples per prompt, its samples."""
    rl = config.rl
    n = rl.rollout.samples_per_prompt
    return str(rl.batch_size) if n == 1 else f"{rl.batch_size} prompts × {n} samples = {rl.samples_per_iteration}"


def describe_rollout(config: PPOConfig) -> str:
    """What the rollout will generate, in the terms of the keys that bound it (S-RUN-3):
    an environment run's episodes and their limits, else one completion per
    prompt of at most rl.rollout.max_new_tokens."""
    rollout, env = config.rl.rollout, config.rl.env
    head = f"rollout: engine {rollout.engine}, temperature {rollout.temperature}, "
    n = rollout.samples_per_prompt
    if env is None:
        each = "one completion per prompt" if n == 1 else f"{n} completions per prompt (rl.rollout.samples_per_prompt)"
        return head + f"max_new_tokens {rollout.max_new_tokens}, {each}"
    if n > 1:
        head += f"{n} episodes per prompt on one task each (rl.rollout.samples_per_prompt), "
    kwargs = "(" + ", ".join(f"{key}={value!r}" for key, value in env.factory_kwargs.items()) + ")"
    return head + (
        f"multi-turn episodes from environment {env.factory}{kwargs} (rl.env.factory): at most {env.max_turns} "
        f"assistant turns (rl.env.max_turns) of at most {env.max_turn_tokens} tokens each (rl.env.max_turn_tokens), "
        f"{env.max_episode_tokens} tokens after the opening (rl.env.max_episode_tokens), tool calls in the "
        f"{env.tool_call_format} format (rl.env.tool_call_format); rl.rollout.max_new_tokens is not used"
    )


def describe_update(run: ManifestRun) -> None:
    """The update's keys a reader should see when they are not the defaults (S-RUN-3):
    how the loss is reduced (S-PATH-2) and how minibatches are cut (S-PATH-3)."""
    config, report = run.config, run.report
    rl = config.rl
    defaults = type(rl).model_fields
    if rl.loss_aggregation != defaults["loss_aggregation"].default:
        budget = (f", constant {rl.generation_budget} tokens" if rl.loss_aggregation == "sequence_mean_token_sum_norm"
                  else "")
        report.summary.append(f"loss: {rl.loss_aggregation} (rl.loss_aggregation{budget})")
    if rl.advantage_estimator != defaults["advantage_estimator"].default:
        estimator = advantage_estimator(rl.advantage_estimator)
        parts = [f"advantages: {estimator.name} (rl.advantage_estimator"]
        if estimator.name == "grpo":
            scaled = "not divided by (rl.grpo_scale=false)" if rl.grpo_scale is False else "divided by"
            parts.append(f", {scaled} the group's std")
        if estimator.uses_groups:
            samples = rl.rollout.samples_per_prompt
            parts.append(f", groups of {samples} samples per prompt")
        if not estimator.uses_critic:
            parts.append("; no critic: none is started, trained or committed")
        report.summary.append("".join(parts) + ")")
    if rl.micro_batch_tokens is not None:
        report.summary.append(
            f"micro-batches: at most {rl.micro_batch_tokens} tokens each, length-grouped (rl.micro_batch_tokens; "
            "rl.micro_batch_size does not cut)"
        )


def check_critic_start(run: ManifestRun) -> None:
    """S-RM-2: a critic started from another folder must read the policy's token ids."""
    config, report = run.config, run.report
    source = config.model.critic_path
    if source is None:
        return
    reward_model = config.rl.reward.model
    pending = [folder for folder, built_later in ((config.model.path, config.model.tiny is not None),
                                                  (source, reward_model is not None and reward_model.path == source
                                                   and reward_model.tiny is not None))
               if built_later and not (Path(folder) / "config.json").is_file()]
    if pending:
        report.summary.append(f"critic: starts from {source} (model.critic_path; checked once {pending[0]} is built)")
        return
    from models.critic_source import critic_source_problems

    problems = critic_source_problems(config.model.path, source)
    for message in problems:
        report.problem("model.critic_path", message)
    if not problems:
        report.summary.append(f"critic: starts from {source} (model.critic_path: its backbone and score head)")


def _check_folder(config: PPOConfig, folder: Path, model_config: dict[str, Any], report: ManifestReport) -> None:
    """S-BYO-1, S-BYO-2: the files every role will load, and the packer they call for."""
    check = check_model_folder(folder, model_config)
    report.problems.extend(Problem(key, message) for key, message in check.problems)
    report.notes.extend(check.notes)
    if config.data_packer.factory:
        report.packer = f"{config.data_packer.factory} (data_packer.factory)"
    elif model_config.get("model_type") in QWEN_VL_MODEL_TYPES:
        report.packer = f"the built-in Qwen-VL packer (model_type {model_config['model_type']})"
    elif check.tokenizer is not None and check.tokenizer.chat_template:
        report.packer = f"chat template (the tokenizer's {check.tokenizer.chat_template})"
    elif check.tokenizer is not None:
        report.packer = "plain text (the tokenizer has no chat template: each prompt string is tokenized as it is)"
        report.plain_text_prompts = True
    if report.packer:
        report.summary.append(f"packer: {report.packer}")


def _read_model_config(config: PPOConfig, report: ManifestReport) -> dict[str, Any] | None:
    """The model's config.json as a dict, without transformers or weights, and the
    folder's files checked. A hub id that is not in the local cache is skipped with a
    note: nothing is downloaded."""
    path = config.model.path
    local = Path(path) / "config.json"
    source: str | None = None
    if local.is_file():
        source = str(local)
    elif config.model.tiny is not None:
        spec = config.model.tiny
        report.summary.append(
            f"model: {path} does not exist yet; the tiny "
            f"{'Qwen2.5-VL' if getattr(spec, 'vision', None) else 'Qwen3'} model is built there from model.tiny "
            f"at start-up ({spec.num_hidden_layers} layers, hidden {spec.hidden_size}), dtype {config.model.dtype}"
        )
        report.packer = config.data_packer.factory or "chat template (the tiny model's tokenizer has one)"
        report.summary.append(f"packer: {report.packer}")
        return spec.model_dump()
    elif HUB_ID.match(path) and not Path(path).exists():
        source = cached_hub_file(path, "config.json")
        if source is None:
            report.summary.append(f"model: {path} (hub id), dtype {config.model.dtype}")
            report.notes.append(
                f"model.path {path!r} is a hub id that is not in the local Hugging Face cache: its config check "
                "(heads vs. tensor parallel size, context length) was skipped; nothing was downloaded"
            )
            return None
    else:
        report.problem("model.path", f"{path!r} has no config.json (expected a Hugging Face model folder or a hub id)")
        return None
    try:
        with open(source, encoding="utf-8") as handle:
            model_config = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        report.problem("model.path", f"cannot read {source}: {error}")
        return None
    if not isinstance(model_config, dict) or "model_type" not in model_config:
        report.problem("model.path", f"{source} is not a transformers model config (no model_type)")
        return None
    architectures = ",".join(model_config.get("architectures") or []) or model_config["model_type"]
    report.summary.append(
        f"model: {path} ({architectures}; {model_sizes(model_config)}), dtype {config.model.dtype}"
    )
    if source == str(local):  # a hub model's cache may hold only config.json: the launch downloads the rest
        _check_folder(config, local.parent, model_config, report)
    return model_config


def check_memory(run: ManifestRun) -> None:
    """What each device group holds, from the models' parameter counts (S-RM-1: the reward
    model's weights in its group); compared with grid.gpu_memory_gib where it is set."""
    config, plan, report = run.config, run.plan, run.report
    estimates = estimate_memory(config, plan)
    report.summary.extend(memory_lines(estimates))
    report.notes.extend(memory_notes(config, estimates))


# --- reward vs. data ---------------------------------------------------------------


def check_reward(run: ManifestRun) -> None:
    """The terminal reward rule or callable resolves; the data checks then read it."""
    run.matcher, run.reward_resolved = _resolve_reward(run.config, run.report)


def _resolve_reward(config: PPOConfig, report: ManifestReport) -> tuple[TerminalMatcher | None, bool]:
    reward = config.rl.reward
    if "rl.reward.terminal_callable" in report.keys():  # already refused: its module cannot be found
        return None, False
    try:
        matcher = resolve_terminal(reward.terminal, reward.terminal_callable, config.job.trusted_modules)
    except RewardConfigError as error:
        if reward.terminal_callable is not None and reward.terminal in SHARED_RULE_NAMES:
            key = "rl.reward.terminal_callable"  # S-REW-4: the callable is what cannot join a shared rule
        else:
            match = re.match(r"(rl\.reward\.\w+)", str(error))
            key = match.group(1) if match else "rl.reward.terminal"
        report.problem(key, str(error))
        return None, False
    if reward.model is not None:
        problems, summary = reward_model_folder_problems(reward.model)
        report.problems.extend(Problem(key, message) for key, message in problems)
        if reward.model.url is not None:  # served: the folder, if any, lends only its tokenizer and template
            report.summary.append(describe_served_reward_model(reward.model))
        elif summary:
            report.summary.append(summary)
        group = plan_placement(config).group_of("reward")
        if group is not None:  # S-RM-1: the frozen reward model's device, as the actors will be placed
            where = f"{group.gpus} GPU(s), {group.key}" if group.gpus else "the host"
            others = "+".join(role for role in group.roles if role != "reward")
            shared = f", shared with the {others}" if others else ""
            report.summary.append(f"reward model placement: {where}{shared} (grid.reward_placement)")
        if reward.model.url is not None:
            _check_reward_server(reward.model, report)
    if matcher is None:
        report.summary.append("reward: no terminal reward (rl.reward.terminal=none)" + _process_text(config))
    else:
        need = (
            f"needs a reference from column {config.rl.data.reference_key!r}"
            if matcher.needs_reference
            else "needs no reference"
        )
        measured = ""
        if reward.model is not None and reward.model.combine == "model":
            measured = ", measured only: rl.reward.model.combine=model"
        report.summary.append(f"reward: terminal {matcher.name} ({need}{measured}){_process_text(config)}")
    return matcher, True


def describe_served_reward_model(settings) -> str:
    """S-RM-1: where the scores come from and how the text sent there is rendered."""
    name = f", model name {settings.served_name!r} (rl.reward.model.served_name)" if settings.served_name else ""
    rendered = (
        f"prompts rendered with the tokenizer and chat template of {settings.path} (rl.reward.model.path; its "
        "weights are not loaded)"
        if settings.path is not None
        else "prompt and completion sent as plain text (no rl.reward.model.path)"
    )
    return (
        f"reward model: served at {settings.url} (rl.reward.model.url{name}); {rendered}; "
        f"combine={settings.combine} ({describe_shaping(settings)})"
    )


def _check_reward_server(settings, report: ManifestReport) -> None:
    """S-RM-1: a served reward model must answer before anything starts."""
    from models.reward_client import RewardClient, RewardServerError

    try:
        served = RewardClient.from_config(settings).check()
    except RewardServerError as error:
        report.problem("rl.reward.model.url", str(error))
        return
    report.summary.append(f"reward model served at {settings.url}: {served}")


def check_served_reward_text(run: ManifestRun) -> None:
    config, report = run.config, run.report
    """S-RM-1: a served reward model without a folder receives plain text, and a
    conversation prompt has no plain text without a chat template to render it. The reward
    role would refuse it at the first batch, after Ray and the models have started."""
    settings = config.rl.reward.model
    if settings is None or settings.url is None or settings.path is not None or report.conversation_prompt is None:
        return
    report.problem(
        "rl.reward.model.path",
        f"is not set, but the prompts are conversations ({report.conversation_prompt}) and the reward model "
        f"served at rl.reward.model.url={settings.url} is sent "
        "text: a conversation needs the reward model's chat template to become that text. Set rl.reward.model.path "
        "to the served model's folder or hub id (only its tokenizer and chat template are loaded), or give plain-text "
        "prompts",
    )


def _process_text(config: PPOConfig) -> str:
    return f", process {config.rl.reward.process}" if config.rl.reward.process != "none" else ""


def _rule_text(config: PPOConfig, matcher: TerminalMatcher) -> str:
    if config.rl.reward.terminal_callable:
        return f"rl.reward.terminal_callable={matcher.name!r}"
    return f"rule {matcher.name!r} (rl.reward.terminal)"


@dataclass(frozen=True)
class DataSource:
    """A data section and the key it sits under: rl.data, or rl.validation.data, whose
    rows the data role reads and projects the same way at start-up."""

    data: DataConfig
    key: str

    @property
    def training(self) -> bool:
        return self.key == "rl.data"

    def label(self, line: str) -> str:
        """A summary line, named after the evaluation rows when it is about them."""
        return line if self.training else f"validation {line}"


def check_training_data(run: ManifestRun) -> None:
    _check_data(run.config, DataSource(run.config.rl.data, "rl.data"), run.matcher, run.reward_resolved, run.report)


def check_validation_data(run: ManifestRun) -> None:
    """The held-out rows, checked as the training rows are (S-BYO-2)."""
    if run.config.rl.validation is not None:
        _check_data(run.config, DataSource(run.config.rl.validation.data, "rl.validation.data"), run.matcher,
                    run.reward_resolved, run.report)


def note_profile_folder(run: ManifestRun) -> None:
    """S-BYO-3: files beside the profile named like a module (notes; the launch prints them too)."""
    if run.profile is not None:
        run.report.profile_notes = shadowing_notes(run.profile)
        run.report.notes.extend(run.report.profile_notes)


def _check_data(
    config: PPOConfig, source: DataSource, matcher: TerminalMatcher | None, reward_resolved: bool,
    report: ManifestReport,
) -> None:
    data, key = source.data, source.key
    needs_reference = matcher is not None and matcher.needs_reference
    if needs_reference and data.reference_key is None:
        report.problem(
            f"{key}.reference_key",
            f"is null, but the reward {_rule_text(config, matcher)} needs a reference answer in every row; "
            f"set {key}.reference_key to the column that holds it, or choose a rule that needs none "
            "(nonempty, constant)",
        )
    if data.path:
        _check_data_file(config, source, matcher, reward_resolved, report)
    elif data.factory:
        _check_data_factory(config, source, matcher, reward_resolved, report)
    else:
        from data.sources import dataset_name_problem

        assert data.name is not None
        problem = dataset_name_problem(data.name, data.split)
        if problem is not None:
            # The reader words it for rl.data; the held-out rows' keys are rl.validation.data's.
            report.problem(f"{key}.split" if "(rl.data.split)" in problem else f"{key}.name",
                           problem.replace("rl.data.", f"{key}."))
            return
        report.summary.append(source.label(f"data: dataset {data.name}[{data.split}]"))
        report.notes.append(
            f"{key}.name={data.name!r}: its rows are read by the data role at start-up (row 0 is projected "
            "there); this check finds its split but does not load its rows"
            if os.path.isdir(data.name) else
            f"{key}.name={data.name!r}: hub datasets are read by the data role at start-up (row 0 is projected "
            "there); this check does not load them"
        )


def _project(config: PPOConfig, source: DataSource, value: Any, where: str, matcher: TerminalMatcher | None,
             reward_resolved: bool, source_key: str, report: ManifestReport) -> Any | None:
    """Project one row exactly as the data role will: its prompt, or None (with a
    problem recorded) when the data role would refuse it."""
    data, key = source.data, source.key
    try:
        prompt = project_prompt(value, prompt_key=data.prompt_key, where=where)
    except PromptError as error:
        problem_key = (
            f"{key}.prompt_key" if error.key_path == data.prompt_key and "is missing" in error.problem else source_key
        )
        report.problem(problem_key, str(error))
        return None
    if report.plain_text_prompts and not isinstance(prompt, str):  # S-BYO-1
        report.problem(f"{key}.prompt_key", conversation_without_template(where, data.prompt_key, config.model.path))
        return None
    if not isinstance(prompt, str) and report.conversation_prompt is None:
        report.conversation_prompt = f"{where}, column {data.prompt_key!r}"
    try:
        required = not reward_resolved or (matcher is not None and matcher.needs_reference)
        project_reference(
            value, reference_key=reference_key_for(value, data.reference_key, required=required), where=where
        )
    except PromptError as error:
        column = data.reference_key
        if not reward_resolved:
            why = "the data role reads it at start-up"
        elif matcher is not None and matcher.needs_reference:
            why = f"the reward {_rule_text(config, matcher)} needs it"
        else:
            reason = f"{_rule_text(config, matcher)} needs" if matcher is not None else "rl.reward.terminal=none needs"
            why = f"{reason} no reference: set {key}.reference_key=null"
        report.problem(f"{key}.reference_key", f"column {column!r}: {error}; {why}")
        return None
    if source.training and len(report.opening_rows) < OPENING_ROWS:
        report.opening_rows.append((value, where))
    return prompt


def check_openings(run: ManifestRun) -> None:
    config, report = run.config, run.report
    """S-BYO-5: an environment's episode openings (messages and tools' schemas through the
    chat template) plus rl.env.max_episode_tokens against the model's positions. Only
    the project's own environments are called here (S-SEC-3); a user's is measured by
    the first episode, which refuses the same way."""
    env = config.rl.env
    if env is None or not report.opening_rows or any(key.startswith(("rl.env", "model.")) for key in report.keys()):
        return  # nothing to measure, or the template or model is refused already
    folder = Path(config.model.path)
    if not within(env.factory.partition(":")[0], PROJECT_CALLABLE_MODULES):
        report.notes.append(
            f"rl.env.factory={env.factory}: user code, which this check does not call; the first episode measures "
            "its opening (messages and tools' schemas) plus rl.env.max_episode_tokens against the model's context"
        )
        return
    if not (folder / "config.json").is_file():
        return  # built at start-up: its rollout actor measures the openings
    positions = config_value(json.loads((folder / "config.json").read_text()), *POSITIONS)
    if not isinstance(positions, int):
        return
    from environments.preflight import measured_openings

    problems, line = measured_openings(config, report.opening_rows, positions)
    report.problems.extend(Problem(key, message) for key, message in problems)
    if line:
        report.summary.append(line)


def _check_data_file(
    config: PPOConfig, source: DataSource, matcher, reward_resolved: bool, report: ManifestReport
) -> None:
    from data.sources import iter_path_rows

    path, path_key = source.data.path, f"{source.key}.path"
    assert path is not None
    rows = 0
    first_rows: dict[tuple[str, ...], tuple[str, Any]] = {}
    started = time.perf_counter()
    try:
        # The data role's own reader: JSON rows, parquet or a saved dataset (S-BYO-4).
        for row in iter_path_rows(path, source.data.split):
            # Every row, in file order, with the data role's own projection: a bad
            # row 90 000 fails here, not an hour into the run (S-DATA-4, S-DATA-5).
            prompt = _project(config, source, row.value, row.where, matcher, reward_resolved, path_key, report)
            if prompt is None:
                return
            if isinstance(prompt, list):  # S-BYO-4: the first row of each role sequence is rendered below
                first_rows.setdefault(role_sequence(prompt), (row.where, prompt))
            rows += 1
    except (ValueError, OSError) as error:  # the readers' errors name the row (and line and column in JSON)
        report.problem(path_key, str(error))
        return
    if rows == 0:
        report.problem(path_key, f"{path} holds no rows")
        return
    report.summary.append(
        source.label(f"data: {path}, every row read and projected in {time.perf_counter() - started:.2f} s")
    )
    if source.training:
        report.data_rows = rows
        report.summary.append(f"data_rows: {rows}")
    else:
        report.summary.append(f"validation rows: {rows}")
    _check_templates(config, first_rows, path_key, source.data.prompt_key, report)


def _check_data_factory(
    config: PPOConfig, source: DataSource, matcher, reward_resolved: bool, report: ManifestReport
) -> None:
    from data.sources import import_callable

    data, factory_key = source.data, f"{source.key}.factory"
    assert data.factory is not None
    if factory_key in report.keys():  # already refused: its module cannot be found
        return
    if not within(data.factory.partition(":")[0], PROJECT_CALLABLE_MODULES):
        # Validation never calls user code in the driver (S-SEC-3): the data role reads
        # and projects its rows, row 0 first, when it starts.
        report.summary.append(source.label(
            f"data: factory {data.factory} (user code: its rows are checked when the data role starts)"
        ))
        return
    try:
        factory = import_callable(data.factory, key=factory_key)
    except ValueError as error:
        report.problem(factory_key, str(error).removeprefix(f"{factory_key}: "))
        return
    try:
        first = list(itertools.islice(iter(factory(**data.factory_kwargs)), 1))
    except TypeError as error:
        report.problem(f"{factory_key}_kwargs", f"{data.factory}({data.factory_kwargs}) fails: {error}")
        return
    except Exception as error:  # user code: any failure is reported, not raised
        report.problem(factory_key, f"{data.factory} raised {type(error).__name__}: {error}")
        return
    if not first:
        report.problem(factory_key, f"{data.factory} yielded no rows")
        return
    where = f"{factory_key} {data.factory} row 0"
    if not isinstance(first[0], dict):
        report.problem(factory_key, f"{where}: expected a dict row, got {type(first[0]).__name__}")
        return
    # Only row 0: a factory may be large or endless; the data role projects the rest.
    prompt = _project(config, source, first[0], where, matcher, reward_resolved, factory_key, report)
    if prompt is not None:
        report.summary.append(source.label(f"data: factory {data.factory}, row 0 projected"))
        _check_templates(config, first_rows_by_roles([(where, prompt)]), factory_key, data.prompt_key, report)


def _check_templates(
    config: PPOConfig, first_rows: dict[tuple[str, ...], tuple[str, Any]], source_key: str, prompt_key: str,
    report: ManifestReport,
) -> None:
    """S-BYO-4: each distinct role sequence of the conversation rows, rendered once (its
    first row) through the policy's chat template, as the packer renders prompts, and
    through a local reward model's, as it renders prompt and completion."""
    if not first_rows:
        return
    rendered: list[str] = []
    skipped: list[str] = []
    policy = _policy_template_folder(config, report, skipped)
    policy_tokenizer = _load_tokenizer(policy, "model.path", report) if policy is not None else None
    if policy_tokenizer is not None:
        failures = render_each_sequence(
            lambda turns: render_prompt(policy_tokenizer, turns), first_rows, prompt_key=prompt_key,
            template=f"the policy's chat template ({policy})",
        )
        report.problems.extend(Problem(source_key, str(failure)) for failure in failures)
        rendered.append("the policy's")
    reward_model = config.rl.reward.model
    folder = Path(reward_model.path) if reward_model is not None and reward_model.path else None
    if folder is not None and not (folder / "config.json").is_file():
        skipped.append(f"the reward model's ({folder} is built at start-up)" if reward_model.tiny is not None
                       else f"the reward model's ({folder} is not a local folder)")
    elif folder is not None:
        reward_tokenizer = _load_tokenizer(folder, "rl.reward.model.path", report)
        if getattr(reward_tokenizer, "chat_template", None):
            failures = render_each_sequence(
                lambda turns: render_scored(reward_tokenizer, turns, "x"), first_rows, prompt_key=prompt_key,
                template=f"the reward model's chat template ({folder})",
            )
            report.problems.extend(Problem(source_key, str(failure)) for failure in failures)
            rendered.append("the reward model's")
        elif reward_tokenizer is not None:
            where = next(iter(first_rows.values()))[0]
            report.problem("rl.reward.model.path", (
                f"{where}: {prompt_key} is a conversation, but {folder}'s tokenizer has no chat template to render it "
                "for the reward model; use a reward model with a chat template, or string prompts"
            ))
    rows = "validation conversations" if source_key.startswith("rl.validation.") else "conversations"
    line = f"{rows}: {len(first_rows)} distinct role sequence{'s' if len(first_rows) != 1 else ''}"
    if rendered:
        line += f", each rendered once through {' and '.join(rendered)} chat template"
    if skipped:
        line += f"; not rendered through {', '.join(skipped)}: the run renders them at start-up"
    report.summary.append(line)


def _policy_template_folder(config: PPOConfig, report: ManifestReport, skipped: list[str]) -> Path | None:
    """The policy folder whose chat template the packer renders with, or None (and why)."""
    folder = Path(config.model.path)
    if config.data_packer.factory:
        skipped.append(f"the policy's (data_packer.factory {config.data_packer.factory} renders its own)")
    elif not (folder / "config.json").is_file():
        skipped.append(f"the policy's ({folder} is built at start-up)" if config.model.tiny is not None
                       else f"the policy's ({config.model.path} is not a local folder)")
    elif report.packer is not None and report.packer.startswith("chat template"):
        return folder
    elif report.packer is not None and not report.plain_text_prompts:
        skipped.append(f"the policy's ({report.packer} renders them)")
    return None


def _load_tokenizer(folder: Path, key: str, report: ManifestReport):
    """The folder's tokenizer, for its chat template, or None (a problem under `key`);
    transformers is imported only for conversation rows with a local folder to render."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder))
    except Exception as error:  # what the folder check cannot see from its files
        report.problem(key, f"{folder}'s tokenizer does not load: {type(error).__name__}: {error}")
        return None


# --- checkpoints -------------------------------------------------------------------


def check_checkpoints(run: ManifestRun) -> None:
    # The launch's own pre-flight finds its resume point itself next; a manifest asks here.
    config, report, resume = run.config, run.report, not run.launching_here
    # The schema admits filesystem paths only (S-CKPT-7, S-SEC-5); what is left to
    # check is that the root can be written and what a launch would resume.
    root = config.job.output_root
    local = Path(root.split("://", 1)[1] if "://" in root else root)
    run_dir = local / config.job.name
    existing = next((p for p in [run_dir, *run_dir.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        report.problem("job.output_root", f"{existing} exists and is not a folder")
        return
    if existing is not None and not os.access(existing, os.W_OK):
        report.problem("job.output_root", f"cannot write under {existing} (the run would create {run_dir})")
        return
    if not resume:  # the launch reads the pointer and takes the lock itself next, refusing with its own errors
        return
    from rundir.run_lock import RunLocked, check_run_lock, stale_after

    try:  # S-FAULT-4: a launch now would be refused while that run lives
        check_run_lock(run_dir, stale_after(config.rl.stage_timeout_seconds))
    except RunLocked as error:
        report.problem("job.name", str(error))
        return
    from checkpoint.boundary import read_latest

    try:
        latest = read_latest(str(run_dir / "checkpoints"))
    except Exception as error:  # a dangling pointer: resume would refuse too
        report.problem("job.name", f"the run's checkpoint pointer is broken: {error}")
        return
    if latest:
        from rundir.resume import ResumeError, resume_boundary
        from rundir.run_outputs import RunPaths

        try:  # the launch's own refusals: warmup, staleness, LoRA, max_steps, a changed base model (S-SEC-4)
            resume_boundary(config, RunPaths.for_config(config), resume=True)
        except ResumeError as error:
            message = str(error)
            key = message.split(":", 1)[0] if re.match(r"^[a-z_]+(\.[a-z_]+)+: ", message) else "job.name"
            report.problem(key, message.removeprefix(f"{key}: "))
            return
    resume = f"resumes from {latest}" if latest else "no committed boundary, starts at iteration 1"
    report.summary.append(f"checkpoints: {run_dir}/checkpoints (local store; {resume})")


# --- options that contradict each other --------------------------------------------


def check_options(run: ManifestRun) -> None:
    config, plan, report = run.config, run.plan, run.report
    rl = config.rl
    if rl.rollout.engine == "vllm" and not plan.uses_gpus:
        report.notes.append(
            "rl.rollout.engine=vllm on a CPU run (grid.gpus_per_node=0) needs vLLM's CPU build in the environment "
            "(docs/launch.md); the `gpu` extra is the CUDA build"
        )
    if not rl.colocated_offload and not (plan.mode == "colocated" and plan.uses_gpus):
        report.notes.append("rl.colocated_offload=false has no effect: policy and rollout do not share a GPU")
    if plan.mode == "colocated" and plan.uses_gpus and not rl.colocated_offload and rl.rollout.engine == "vllm":
        report.notes.append(
            "rl.colocated_offload=false: vLLM keeps "
            f"rl.rollout.gpu_memory_utilization={rl.rollout.gpu_memory_utilization} of each shared GPU "
            "while the trainer holds its weights and optimizer state there too"
        )
    if rl.save_every == 0 and not rl.save_final:
        report.notes.append(
            "rl.save_every=0 and rl.save_final=false: no boundary is committed, the run cannot be resumed"
        )
    if rl.critic_warmup_iterations >= rl.max_steps:
        report.notes.append(
            f"rl.critic_warmup_iterations={rl.critic_warmup_iterations} covers every iteration: "
            "the actor is never updated"
        )


def describe_transport(config: PPOConfig) -> str:
    """How published weights reach the engines (S-XFER-1), as the manifest and the
    command line's first lines say it."""
    if config.rl.weight_sync_transport == "nixl":
        network = "loopback only" if config.grid.num_nodes == 1 else "UCX_NET_DEVICES or every interface"
        return f"nixl (engines READ the policy's registered memory over UCX, {network}; nothing in the object store)"
    return "object_store (Ray's object store, bucket by bucket)"
