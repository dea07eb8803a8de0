"""The `ppo` flow: one Prefect flow run is one training run.

The body reads like the algorithm: a plain loop over outer iterations, each a fixed
sequence of stage tasks (S-FLOW-1). Parameters are flat so the Prefect UI form and
`prefect deployment run --params` can set them.

CLI: `python -m flows.ppo --config FILE [--validate-manifest] [-- key=value ...]`.
"""

from __future__ import annotations

import os
import sys

from flows.environment import apply_default_environment

if __name__ == "__main__":
    apply_default_environment()
    if "--validate-manifest" in sys.argv:
        # Validation must stay fast and allocate nothing: answer before Prefect,
        # Ray and torch are even imported (S-RUN-3).
        from flows.cli import main as _validate_main

        sys.exit(_validate_main())

import time
from contextlib import contextmanager
from typing import Any, Iterator

from prefect import flow, get_run_logger
from ray.exceptions import RayTaskError

from algorithm.update_plan import UpdatePlan
from algorithm.warmup import is_critic_warmup
from checkpoint.boundary import CommittedBoundary
from configs.loading import load_config
from configs.schema import PPOConfig
from flows.resume import ResumePoint, find_resume_point, restore_roles
from tasks.faults import fault_point
from flows.history import RunHistory
from flows.run_outputs import RunPaths, append_metrics, read_metrics
from roles.actors import connect_ray, start_role_actors, stop_role_actors
from tasks.commit import commit_stage, export_stage, save_artifact_stage
from tasks.stages import (
    await_park,
    critic_predict_stage,
    dispatch_iteration,
    prepare_batch_stage,
    reference_stage,
    reward_stage,
    rollout_stage,
    train_critic_stage,
    train_policy_stage,
    weight_sync_stage,
)

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
    config = load_config(profile, extra)
    updates: dict[str, Any] = {}
    if "://" not in config.job.output_root:
        updates["job"] = config.job.model_copy(update={"output_root": os.path.abspath(config.job.output_root)})
    if config.model.tiny is not None and "://" not in config.model.path:
        updates["model"] = config.model.model_copy(update={"path": os.path.abspath(config.model.path)})
    if config.rl.data.path and "://" not in config.rl.data.path:
        data = config.rl.data.model_copy(update={"path": os.path.abspath(config.rl.data.path)})
        updates["rl"] = config.rl.model_copy(update={"data": data})
    return config.model_copy(update=updates)


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    parameters = flow_run.parameters
    if parameters.get("run_name"):
        return str(parameters["run_name"])
    try:
        return resolve_config(
            parameters.get("profile", DEFAULT_PROFILE), parameters.get("overrides"), None, None
        ).job.name
    except Exception:  # the flow body reports config errors properly
        return "ppo-invalid-config"


def save_kind(config: PPOConfig, iteration: int) -> str | None:
    """"full" (a committed, resumable boundary), "model" (a weights-only artifact) or
    None. The final save is always full so a finished run can be extended (S-CKPT-5)."""
    rl = config.rl
    if rl.save_final and iteration == rl.max_steps:
        return "full"
    if rl.save_every and iteration % rl.save_every == 0:
        return rl.save_plan
    return None


@flow(name="ppo", flow_run_name=_flow_run_name, persist_result=False, log_prints=False)
def ppo(
    profile: str = DEFAULT_PROFILE,
    overrides: list[str] | None = None,
    critic_warmup_iterations: int | None = None,
    resume: bool = True,
    run_name: str | None = None,
) -> dict[str, Any]:
    """One PPO training run.

    Args:
        profile: Python config file defining CONFIG (e.g. configs/ppo_tiny_cpu.py).
        overrides: `key=value` overrides, same syntax as the CLI (`rl.max_steps=5`).
        critic_warmup_iterations: if set, overrides rl.critic_warmup_iterations.
        resume: continue from the run's last committed boundary (default); False
            starts fresh and refuses to overwrite a run that has one.
        run_name: if set, overrides job.name.
    """
    logger = get_run_logger()
    config = resolve_config(profile, overrides, critic_warmup_iterations, run_name)
    paths = RunPaths.for_config(config)
    resume_point = find_resume_point(config, paths, resume=resume)
    paths.ensure()
    started_ray = connect_ray(config)
    roles = None
    history = None
    try:
        roles = start_role_actors(config)
        policy_version = restore_roles(roles, resume_point, config, paths) if resume_point else 0
        start = resume_point.iteration + 1 if resume_point else 1
        logger.info(
            f"run {config.job.name}: iterations {start}..{config.rl.max_steps}, "
            f"critic warmup {config.rl.critic_warmup_iterations}, outputs {paths.run_dir}"
        )
        history = RunHistory.start(config.job.name, config.rl.max_steps, read_metrics(paths.metrics), start_iteration=start)
        summary = run_iterations(config, roles, paths, start, policy_version, history)
        summary["resumed_from"] = resume_point.boundary if resume_point else None
        history.finish(summary)
        return summary
    except Exception as error:
        if history is not None:
            history.fail(error)
        raise
    finally:
        stop_role_actors(roles)
        if started_ray:
            import ray

            ray.shutdown()


def run_iterations(
    config: PPOConfig, roles, paths: RunPaths, start: int, policy_version: int, history: RunHistory | None = None
) -> dict[str, Any]:
    logger = get_run_logger()
    rl = config.rl
    warmup = rl.critic_warmup_iterations
    last_commit: CommittedBoundary | None = None
    for iteration in range(start, rl.max_steps + 1):
        iteration_started = time.perf_counter()
        record: dict[str, Any] = {"iteration": iteration}
        stage_seconds: dict[str, float] = {}

        upstream: list[Any] = []  # the previous stage's result: an arrow in the UI's graph

        def timed(stage: str, fn, *args):
            t0 = time.perf_counter()
            with naming_failures(stage, iteration):
                result = fn(*args, wait_for=list(upstream) or None)
            stage_seconds[stage] = time.perf_counter() - t0
            upstream[:] = [result]
            return result

        plan = UpdatePlan(rl.epochs, rl.minibatch_size, rl.micro_batch_size, config.job.seed, iteration)
        actor_warmup = is_critic_warmup(iteration, warmup)
        calls = dispatch_iteration(roles, iteration, rl.batch_size, policy_version, plan, actor_warmup)
        for stage, stage_task in (
            ("rollout", rollout_stage),
            ("reward", reward_stage),
            ("reference_score", reference_stage),
            ("critic_predict", critic_predict_stage),
        ):
            record.update(timed(stage, stage_task, calls, iteration))
        batch_id, m = timed("prepare_batch", prepare_batch_stage, calls, iteration)
        record.update(m)

        t0 = time.perf_counter()
        futures = [train_critic_stage.submit(calls, iteration, wait_for=upstream)]
        if not actor_warmup:
            futures.insert(0, train_policy_stage.submit(calls, iteration, wait_for=upstream))
        with naming_failures("train", iteration):
            receipts = [future.result() for future in futures]  # per role: every rank's receipt
        upstream[:] = futures
        stage_seconds["train"] = time.perf_counter() - t0
        for role_receipts in receipts:
            check_receipts(role_receipts, batch_id, iteration)
            record.update(role_receipts[0].metrics)

        fault_point(iteration, "after_train")
        if not actor_warmup:  # S-CW-5: no weight delta, no transfer during warmup
            policy_version, m = timed("weight_sync", weight_sync_stage, calls, iteration)
            record.update(m)
        else:
            with naming_failures("train", iteration):  # S-RUN-4: parked before the next rollout
                record.update(await_park(calls))
        record["train/actor_warmup"] = 1.0 if actor_warmup else 0.0
        record["train/policy_version"] = float(policy_version)

        fault_point(iteration, "before_commit")
        kind = save_kind(config, iteration)
        if kind == "full":
            last_commit = timed(
                "commit",
                commit_stage,
                roles,
                paths.checkpoints,
                iteration,
                policy_version,
                {"critic_warmup_iterations": warmup},
                rl.keep_optim_last,
            )
        elif kind == "model":
            timed("commit", save_artifact_stage, roles, paths.artifacts, iteration)
        for stage, seconds in stage_seconds.items():
            record[f"time/{stage}_seconds"] = seconds
        record["time/iteration_seconds"] = time.perf_counter() - iteration_started
        append_metrics(paths.metrics, record)
        if history is not None:
            history.add_iteration(record)
        line = progress_line(config, record)
        print(line, flush=True)
        logger.info(line)

    exported = None
    if last_commit is not None and last_commit.iteration == rl.max_steps:
        exported = export_stage(last_commit.path, paths.final_model, rl.max_steps)
    return {
        "run_name": config.job.name,
        "run_dir": paths.run_dir,
        "iterations": rl.max_steps,
        "policy_version": policy_version,
        "last_boundary": last_commit.path if last_commit else None,
        "final_model": exported,
        "actor_untouched": warmup >= rl.max_steps,
        **reward_rise(read_metrics(paths.metrics)),
    }


class StageFailed(RuntimeError):
    """A stage of an iteration raised. The message leads with the task run's name
    (`reward[iter=3]`), so the flow run's state, the CLI's last line and the summary
    artifact all say where the run broke; the original error is chained."""


@contextmanager
def naming_failures(stage: str, iteration: int) -> Iterator[None]:
    try:
        yield
    except StageFailed:
        raise
    except Exception as error:
        cause = error.cause if isinstance(error, RayTaskError) and error.cause is not None else error
        raise StageFailed(f"{stage}[iter={iteration}] failed: {type(cause).__name__}: {cause}") from error


def reward_rise(records: list[dict[str, Any]], window: int = 10) -> dict[str, float | None]:
    """First-`window` vs last-`window` mean reward over the whole run (resumed parts
    included): the one number that says whether the policy learned."""
    rewards = [r["train/reward_mean"] for r in sorted(records, key=lambda r: r["iteration"])]
    if not rewards:
        return {"first_reward_mean": None, "last_reward_mean": None, "reward_window": window}
    # Disjoint windows when the run is short, so "rise" compares different iterations.
    window = max(1, min(window, len(rewards) // 2))
    first = sum(rewards[:window]) / window
    last = sum(rewards[-window:]) / window
    return {"first_reward_mean": first, "last_reward_mean": last, "reward_window": window}


def check_receipts(receipts, batch_id: str, iteration: int) -> None:
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


def progress_line(config: PPOConfig, record: dict[str, Any]) -> str:
    policy_loss = record.get("train/policy_loss")
    phase = "critic-warmup" if record["train/actor_warmup"] else f"pv={int(record['train/policy_version'])}"
    return (
        f"iter {record['iteration']:>4}/{config.rl.max_steps}  reward {record['train/reward_mean']:.3f}  "
        f"policy_loss {'   -   ' if policy_loss is None else f'{policy_loss:+.4f}'}  "
        f"value_loss {record['train/value_loss']:.4f}  kl {record['train/kl']:+.4f}  {phase}  "
        f"{record['time/iteration_seconds']:.2f}s"
    )


if __name__ == "__main__":
    from flows.cli import main

    sys.exit(main(flow_fn=ppo))
