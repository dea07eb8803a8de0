"""The `ppo` flow: one Prefect flow run is one training run.

Set-up (config, resume point, Ray, role actors), then the iterations (flows/iteration.py,
one Prefect task per stage), then the final export and the run's summary. Parameters
are flat so the Prefect UI form and `prefect deployment run --params` can set them.
The command line (`python -m flows.ppo`) is cli/command.py.
"""

from __future__ import annotations

from processes import ray_auth_first  # noqa: F401  (before anything below imports Ray)

import dataclasses
import time
from typing import Any, Callable

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import StateType
from prefect.states import Cancelled

from configs.schema import PPOConfig
from flows.failures import StageFailed
from views.history import RunHistory
from flows.iteration import first_step, held_batch
from flows.launch import Launch, handed_launch, take_launch
from flows.stopping import Stopped, exit_now, stop_signals
from rundir.resume import find_resume_point, restore_roles, start_from_scratch, verify_resume_point
from rundir.run_config import DEFAULT_PROFILE, resolve_config
from rundir.run_lock import RunLock, local_run_dir, stale_after
from rundir.run_outputs import RunPaths, append_metrics, read_metrics
from flows.flow_runner import FlowIterationLoop, FlowRunner
from views.trackers import open_trackers
from placement.nodes import describe_layout, node_addresses
from processes.actors import RoleHandles, kill_run_actors, start_role_actors, startup_timeout, stop_role_actors
from tasks.prefect_tasks import export
from processes.ray_session import connect_ray, shutdown_ray

def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    parameters = flow_run.parameters
    if parameters.get("run_name"):
        return str(parameters["run_name"])
    launch = handed_launch()
    if launch is not None:
        return launch.config.job.name
    try:
        return resolve_config(
            parameters.get("profile", DEFAULT_PROFILE), parameters.get("overrides"), None, None
        ).job.name
    except Exception:  # the flow body reports config errors properly
        return "ppo-invalid-config"


@flow(name="ppo", flow_run_name=_flow_run_name, persist_result=False, log_prints=False)
def ppo(
    profile: str = DEFAULT_PROFILE,
    overrides: list[str] | None = None,
    critic_warmup_iterations: int | None = None,
    resume: bool = True,
    run_name: str | None = None,
    resume_from: str | None = None,
    auto_resume_attempts: int = 0,
) -> dict[str, Any]:
    """One PPO training run.

    Args:
        profile: Python config file defining CONFIG (e.g. configs/ppo_tiny_cpu.py).
        overrides: `key=value` overrides, same syntax as the CLI (`rl.max_steps=5`).
        critic_warmup_iterations: if set, overrides rl.critic_warmup_iterations.
        resume: continue from the run's last committed boundary (default); False
            starts fresh and refuses to overwrite a run that has one.
        run_name: if set, overrides job.name.
        resume_from: an earlier committed boundary of this run (`iter_000010`) to go
            back to, verified first; the metrics rows after it are set aside and the
            later boundaries are replaced as the run commits them anew (S-FAULT-3).
        auto_resume_attempts: when a stage fails (a dead or hung actor, a lost node,
            a failed save), start the role actors afresh and resume from the last
            committed boundary, up to this many times, within this flow run (S-FAULT-5).
            Refusals (config, checkpoint, a live run of the same name) are never retried.
    """
    logger = get_run_logger()
    say(f"prefect: flow run {_flow_run_label()} started")
    # A run the automation rescheduled after a crash resumes, whatever it was started with.
    attempt = crash_resumes(auto_resume_attempts)
    launch = take_launch(profile, overrides, critic_warmup_iterations, run_name, resume=resume or attempt > 0,
                         resume_from=resume_from if attempt == 0 else None)
    config, paths = launch.config, launch.paths
    # S-FAULT-4: one writer per run directory, taken before anything is read or written
    # (by the command line, before it started any service, when it launched this run).
    stale = stale_after(config.rl.stage_timeout_seconds)
    lock = launch.lock or RunLock(local_run_dir(paths.run_dir), stale_after_s=stale)
    if lock.holder is None:
        lock.acquire()
    lock.renew(flow_run=_flow_run_label())
    if lock.took_over is not None:
        logger.warning(f"took over the run lock of a run that is no longer alive: {lock.took_over.describe()}")
    try:
        while True:
            try:
                summary = _train(launch, lock, first_attempt=attempt == 0)
                stopped = summary.get("stopped")
                # S-STOP-2: a stopped run ends Cancelled, which the crash automation never restarts.
                return Cancelled(message=Stopped(**stopped).line()) if stopped else summary
            except StageFailed as error:
                if attempt >= auto_resume_attempts:
                    raise
                attempt += 1
                say(f"auto-resume: attempt {attempt} of {auto_resume_attempts} after `{error}`; "
                    "resuming from the last committed boundary")
    finally:
        lock.release()


AUTO_RESUME_STATE = "AutoResume"  # the state name deployments/automations.yaml reschedules a crashed run under


class AutoResumeExhausted(RuntimeError):
    """A crashed run came back more often than its `auto_resume_attempts` allow."""


def crash_resumes(auto_resume_attempts: int) -> int:
    """How many automatic resumes this flow run has used: the times the automation
    rescheduled it after its process crashed. Past the bound the run fails (Failed,
    which the automation leaves alone) instead of crashing again and again."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return 0
    with get_client(sync_client=True) as client:
        used = automatic_resumes(client.read_flow_run_states(flow_run.id))
    if used > auto_resume_attempts:
        raise AutoResumeExhausted(
            f"the flow process crashed {used} times and auto_resume_attempts={auto_resume_attempts}; not resuming "
            "again by itself. Find the cause in the crashed attempts' logs, then run it again (or press Retry)."
        )
    if used:
        say(f"auto-resume: attempt {used} of {auto_resume_attempts} after the flow process crashed; "
            "resuming from the last committed boundary")
    return used


def automatic_resumes(states: list[Any]) -> int:
    """Crashed attempts the automation rescheduled since a person last scheduled the
    run (created it, or pressed Retry: a Retry after the bound starts a fresh budget).
    Two reschedules with no attempt running between them are one crash."""
    used, ran = 0, False
    for state in sorted(states, key=lambda state: state.timestamp):
        if state.name == AUTO_RESUME_STATE:
            used += ran
            ran = False
        elif state.type == StateType.SCHEDULED:
            used, ran = 0, False
        elif state.type == StateType.RUNNING:
            ran = True
    return used


def say(line: str) -> None:
    """Start-up progress: on the terminal of a CLI run, in the flow run's log in the UI."""
    print(line, flush=True)
    get_run_logger().info(line)


def _flow_run_label() -> str:
    from prefect.runtime import flow_run

    return f"{flow_run.name} ({flow_run.id})" if flow_run.id else "-"


def _train(launch: Launch, lock: RunLock, first_attempt: bool) -> dict[str, Any]:
    logger = get_run_logger()
    config, paths = launch.config, launch.paths
    if first_attempt:  # the launch's resume point, its files now read back under the lock
        resume_point = verify_resume_point(launch.resume_point)
    else:  # an automatic resume: from whatever the failed attempt last committed
        resume_point = find_resume_point(config, paths, resume=True)
    paths.ensure()
    if resume_point is None:
        start_from_scratch(paths)
    started = time.perf_counter()
    started_ray = connect_ray(config)
    say(
        f"ray: {'started a local Ray' if started_ray else 'using the connected Ray'} "
        f"in {time.perf_counter() - started:.1f} s"
    )
    roles = None
    runner = None
    history = None
    trackers = None
    try:
        roles = start_role_actors(config, startup_timeout(config.rl.stage_timeout_seconds), launch.adopt_actors())
        slowest = sorted(roles.ready_seconds.items(), key=lambda item: item[1])
        say(f"actors: {len(slowest)} ready in {slowest[-1][1]:.1f} s ("
            + ", ".join(f"{label} {seconds:.1f}" for label, seconds in slowest) + ")")
        runner = FlowRunner(roles, stage_timeout_s=config.rl.stage_timeout_seconds)
        if len(node_addresses()) > 1:  # on a cluster: where the plan put each role (S-RUN-4, S-TEAM-2)
            say(f"nodes: {describe_layout(runner.layout())}")
        policy_version = restore_roles(runner, roles, resume_point, config, paths) if resume_point else 0
        if resume_point:
            say(
                f"resume: from {resume_point.boundary} "
                f"(iteration {resume_point.iteration}, policy_version {policy_version})"
            )
        start = resume_point.iteration + 1 if resume_point else 1
        logger.info(
            f"run {config.job.name}: iterations {start}..{config.rl.max_steps}, "
            f"critic warmup {config.rl.critic_warmup_iterations}, outputs {paths.run_dir}"
        )
        history = RunHistory.start(
            config.job.name, config.rl.max_steps, read_metrics(paths.metrics), start_iteration=start
        )
        trackers = open_trackers(config, paths, first_step(config, start))

        def record_iteration(record: dict[str, Any]) -> None:
            append_metrics(paths.metrics, record)
            trackers.log(record)
            lock.renew()
            history.add_iteration(record)
            line = progress_line(config, record)
            print(line, flush=True)
            logger.info(line)

        loop = FlowIterationLoop(runner, roles, config, paths, record_iteration, stop=launch.stop)
        if resume_point:
            loop.in_flight = held_batch(runner, roles, resume_point.boundary, resume_point.iteration)
        launch.stop.hard_stop = hard_stop_of(config)
        with stop_signals(launch.stop):
            policy_version, last_commit = loop.run_iterations(start, config.rl.max_steps, policy_version)
        exported = None
        if last_commit is not None and last_commit.iteration == config.rl.max_steps:
            exported = export(config.rl.max_steps, last_commit.path, paths.final_model, roles.policy)
        summary = run_summary(config, paths, roles, runner, policy_version, last_commit, exported)
        summary["resumed_from"] = resume_point.boundary if resume_point else None
        if loop.stopped is not None:
            summary["stopped"] = dataclasses.asdict(loop.stopped)
            logger.warning(loop.stopped.line())
        history.finish(summary)
        runner.wait_recorded()  # the last block's task runs, recorded while the run closed (FlowRunner.block_ran)
        return summary
    except Exception as error:
        if history is not None:
            history.fail(error)
        if runner is not None:
            try:  # a failure after the last block (the export) still shows all that block's task runs
                runner.wait_recorded()
            except Exception as wait_error:  # never in place of the run's own error
                logger.warning(f"could not confirm the last block's task runs were recorded: {wait_error!r}")
        raise
    finally:
        if trackers is not None:
            trackers.close()
        stop_role_actors(roles)
        if started_ray:
            shutdown_ray()


def run_summary(
    config: PPOConfig,
    paths: RunPaths,
    roles: RoleHandles,
    runner: FlowRunner,
    policy_version: int,
    last_commit,
    exported,
) -> dict[str, Any]:
    updates = runner.get(roles.policy.update_counts.remote())
    return {
        "run_name": config.job.name,
        "run_dir": paths.run_dir,
        "iterations": config.rl.max_steps,
        "policy_version": policy_version,
        "last_boundary": last_commit.path if last_commit else None,
        "final_model": exported,
        # Observed from the policy itself: no optimizer step and no published version.
        "actor_untouched": updates["optimizer_step"] == 0 and updates["policy_version"] == 0,
        **reward_rise(read_metrics(paths.metrics)),
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


def progress_line(config: PPOConfig, record: dict[str, Any]) -> str:
    evaluated = validation_text(record)
    if "train/reward_mean" not in record:  # iteration 0: the starting policy's evaluation only
        return f"iter {record['iteration']:>4}/{config.rl.max_steps}  before training: {evaluated.strip()}"
    policy_loss = record.get("train/policy_loss")
    phase = "critic-warmup" if record["train/actor_warmup"] else f"pv={int(record['train/policy_version'])}"
    return (
        f"iter {record['iteration']:>4}/{config.rl.max_steps}  reward {record['train/reward_mean']:.3f}  "
        f"policy_loss {'   -   ' if policy_loss is None else f'{policy_loss:+.4f}'}  "
        f"value_loss {record['train/value_loss']:.4f}  kl {record['train/kl']:+.4f}  {phase}  "
        f"{record['time/iteration_seconds']:.2f}s{evaluated}"
    )


def validation_text(record: dict[str, Any]) -> str:
    if "val/reward_mean" not in record:
        return ""
    exact = record.get("val/exact_match")
    return f"  val reward {record['val/reward_mean']:.3f}" + ("" if exact is None else f" exact {exact:.3f}")


def hard_stop_of(config: PPOConfig) -> Callable[[str], None]:
    """What a second signal or the end of the grace does: kill the run's actors (on a
    cluster they would outlive this process) and exit now; the last committed boundary
    stands, as after any crash."""
    def hard_stop(why: str) -> None:
        try:
            kill_run_actors(config.job.name)
        except Exception:  # the exit must happen whatever the cluster says
            pass
        exit_now(why)

    return hard_stop
