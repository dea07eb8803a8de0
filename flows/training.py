"""The `ppo` flow: one Prefect flow run is one training run.

Set-up (config, resume point, Ray, role actors), then the iterations (flows/iteration.py,
one Prefect task per stage), then the final export and the run's summary. Parameters
are flat so the Prefect UI form and `prefect deployment run --params` can set them.
The command line (`python -m flows.ppo`) is cli/command.py.
"""

from __future__ import annotations

from processes import ray_auth_first  # noqa: F401  (before anything below imports Ray)

import contextlib
import dataclasses
import os
import time
from typing import Any, Callable

from prefect import flow, get_run_logger
from prefect.states import Cancelled, Completed

from compat.prefect_compat import quiet_completed_task_lines
from checkpoint.boundary import CommittedBoundary
from contracts.artifact_keys import artifact_key
from flows.auto_resume import crash_resumes
from flows.failures import StageFailed
from flows.run_report import model_build_line, progress_line, run_summary, say, stopped_summary
from views.history import RunHistory
from flows.iteration import first_step
from flows.launch import Launch, current_mode, handed_launch, take_launch
from flows.launch_mode import hard_stop_of
from flows.stopping import Stopped, StopSignalled, stop_signals, take_sigterm_back
from rundir.resume import ResumePoint, find_resume_point, verify_resume_point
from rundir.run_config import DEFAULT_PROFILE, resolve_config
from rundir.run_lock import RunLock
from rundir.run_outputs import append_metrics, read_metrics
from flows.flow_runner import FlowIterationLoop, FlowRunner
from flows.iteration_loop import Resumed, open_run_dir, resume_roles
from views.trackers import open_trackers
from placement.nodes import describe_layout, node_addresses
from processes.actors import RoleHandles, start_role_actors, startup_timeout, stop_role_actors
from tasks.prefect_tasks import export


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
            later boundaries are replaced as the run commits them anew.
        auto_resume_attempts: when a stage fails (a dead or hung actor, a lost node,
            a failed save), start the role actors afresh and resume from the last
            committed boundary, up to this many times, within this flow run.
            Refusals (config, checkpoint, a live run of the same name) are never retried.
    """
    try:
        return _run(profile, overrides, critic_warmup_iterations, resume, run_name, resume_from, auto_resume_attempts)
    except Exception as error:
        current_mode().failed(error)  # a deployment's run logs its last lines; the command line prints them
        raise


def _run(
    profile: str, overrides: list[str] | None, critic_warmup_iterations: int | None, resume: bool,
    run_name: str | None, resume_from: str | None, auto_resume_attempts: int,
) -> Any:
    say(f"prefect: flow run {_flow_run_label()} started")
    quiet_completed_task_lines()
    # A run the automation rescheduled after a crash resumes, whatever it was started with.
    attempt = crash_resumes(auto_resume_attempts)
    launch = take_launch(profile, overrides, critic_warmup_iterations, run_name, resume=resume or attempt > 0,
                         resume_from=resume_from if attempt == 0 else None)
    if launch.finished:  # nothing to train or export; Ray is never started
        say(f"done: {launch.finished_line()}")
        return Completed(message=launch.finished_line())
    launch.mode.announce(launch.packer, launch.profile_notes)
    if building := model_build_line(launch.config):
        say(building)
    lock = _hold_run_lock(launch)
    # S-STOP-4: a stop is honoured from here to the end, start-up and export included.
    try:
        with stop_signals(launch.stop, in_a_flow=True):
            return _attempts(launch, lock, attempt, auto_resume_attempts)
    finally:
        lock.release()
        launch.mode.ended(launch.stop)


def _hold_run_lock(launch: Launch) -> RunLock:
    """S-FAULT-4: one writer per run directory, taken before anything is read or written
    (by the command line, before it started any service, when it launched this run)."""
    lock = launch.lock or RunLock.of_run(launch.config, launch.paths)
    if lock.holder is None:
        lock.acquire()
    lock.renew(flow_run=_flow_run_label())
    if lock.took_over is not None:
        get_run_logger().warning(
            f"took over the run lock of a run that is no longer alive: {lock.took_over.describe()}"
        )
    return lock


def _attempts(launch: Launch, lock: RunLock, attempt: int, allowed: int) -> Any:
    """The run, and on a failed stage as many automatic resumes as allowed; refusals, a
    stop and a failure that would repeat are never retried."""
    while True:
        try:
            summary = _train(launch, lock, first_attempt=attempt == 0)
        except StageFailed as error:
            if attempt >= allowed or launch.stop.signalled() is not None or error.repeats:
                raise
            attempt += 1
            say(f"auto-resume: attempt {attempt} of {allowed} after `{error}`; "
                "resuming from the last committed boundary")
            continue
        stopped = summary.get("stopped")
        if not stopped:
            return summary
        launch.mode.clean_stop()
        # S-STOP-2: a stopped run ends Cancelled, which the crash automation never restarts.
        return Cancelled(message=Stopped(**stopped).line(launch.mode.resume_hint))


def _flow_run_label() -> str:
    from prefect.runtime import flow_run

    return f"{flow_run.name} ({flow_run.id})" if flow_run.id else "-"


def _train(launch: Launch, lock: RunLock, first_attempt: bool) -> dict[str, Any]:
    """One attempt: what it starts (Ray, the role actors, the trackers) is owned by one
    stack, closed however the attempt ends; a stop in the start-up or the restore is one
    exception, caught here, that keeps the boundary the run resumed from (S-STOP-4)."""
    config, paths, stop = launch.config, launch.paths, launch.stop
    if first_attempt:  # the launch's resume point, its files now read back under the lock
        point = verify_resume_point(launch.resume_point)
    else:  # an automatic resume: from whatever the failed attempt last committed
        point = find_resume_point(config, paths, resume=True, identity=launch.identity)
    open_run_dir(paths, point)
    stop.progress.kept(*((point.iteration, point.boundary) if point else (0, None)))
    with contextlib.ExitStack() as owned:
        try:
            _connect_ray(owned, launch)
            stop.hard_stop = hard_stop_of(launch)
            stop.check()  # stopped while Ray started: nothing of the run ran yet
            runner, roles = _start_actors(owned, launch)
            resumed = _restore(runner, roles, launch, point)
        except StopSignalled:
            stopped = stop.stopped_at(stop.progress.committed, stop.progress.boundary)
            launch.mode.stopped(lock, stopped)
            return stopped_summary(config, paths, stopped)
        summary = _iterate(owned, launch, lock, runner, roles, resumed)
        summary["resumed_from"] = point.boundary if point else None
        return summary


def _connect_ray(owned: contextlib.ExitStack, launch: Launch) -> None:
    """Ray is connected once: by the command line that handed this launch over, else here."""
    started = time.perf_counter()
    session = launch.mode.connect_ray(launch.config, launch.code_dirs)
    take_sigterm_back(launch.stop)
    if session is not None:
        launch.ray = session
        owned.callback(session.close)
    how = "using the connected Ray" if session is None else (
        "joined the Ray cluster" if session.address else "started a local Ray"
    )
    say(f"ray: {how} in {time.perf_counter() - started:.1f} s")


def _start_actors(owned: contextlib.ExitStack, launch: Launch) -> tuple[FlowRunner, RoleHandles]:
    config, progress = launch.config, launch.stop.progress
    progress.doing = "the start of the role actors"
    try:
        roles = start_role_actors(config, startup_timeout(config.rl.stage_timeout_seconds), launch.adopt_actors())
    except BaseException:
        stop_role_actors(None)  # a start-up that failed half way: the placements it reserved
        raise
    owned.callback(stop_role_actors, roles)
    launch.stop.check()  # while the actors started
    slowest = sorted(roles.ready_seconds.items(), key=lambda item: item[1])
    say(f"actors: {len(slowest)} ready in {slowest[-1][1]:.1f} s ("
        + ", ".join(f"{label} {seconds:.1f}" for label, seconds in slowest) + ")")
    runner = FlowRunner(
        roles, stage_timeout_s=config.rl.stage_timeout_seconds, samples_key=artifact_key(config.job.name, "samples")
    )
    runner.running = progress.stages
    owned.push(_on_failure(lambda error: _wait_recorded(runner)))
    if len(node_addresses()) > 1:  # on a cluster: where the plan put each role (S-RUN-4, S-TEAM-2)
        say(f"nodes: {describe_layout(runner.layout())}")
    return runner, roles


def _restore(runner: FlowRunner, roles: RoleHandles, launch: Launch, point: ResumePoint | None) -> Resumed:
    if point:
        launch.stop.progress.doing = f"the restore of {point.boundary}"
    resumed = resume_roles(runner, roles, launch.config, launch.paths, point)
    if point:
        say(f"resume: from {point.boundary} (iteration {point.iteration}, policy_version {resumed.policy_version})")
    launch.stop.check()  # during the restore: the boundary it restored is still the last one
    return resumed


def _iterate(
    owned: contextlib.ExitStack, launch: Launch, lock: RunLock, runner: FlowRunner, roles: RoleHandles,
    resumed: Resumed,
) -> dict[str, Any]:
    """The iterations, then the final export, then the run's summary."""
    config, paths, stop = launch.config, launch.paths, launch.stop
    logger, start = get_run_logger(), resumed.start
    logger.info(
        f"run {config.job.name}: iterations {start}..{config.rl.max_steps}, "
        f"critic warmup {config.rl.critic_warmup_iterations}, outputs {paths.run_dir}"
    )
    history = RunHistory.start(
        config.job.name, config.rl.max_steps, read_metrics(paths.metrics), start_iteration=start,
        commit_every=config.rl.save_every or 0,
    )
    owned.push(_on_failure(history.fail))
    trackers = open_trackers(config, paths, first_step(config, start))
    owned.callback(trackers.close)

    def record_iteration(record: dict[str, Any]) -> None:
        append_metrics(paths.metrics, record)
        trackers.log(record)
        lock.renew()
        history.add_iteration(record)
        line = progress_line(config, record)
        print(line, flush=True)
        logger.info(line)

    loop = FlowIterationLoop(runner, roles, config, paths, record_iteration, stop=stop, on_block_end=history.end_block)
    loop.in_flight, loop.identity = resumed.in_flight, launch.identity
    policy_version, last_commit = loop.run_iterations(start, config.rl.max_steps, resumed.policy_version or 0)
    exported, last_boundary = _export(launch, roles, loop, last_commit)
    summary = run_summary(config, paths, roles, runner, policy_version, last_boundary, exported)
    if loop.stopped is not None:
        summary["stopped"] = dataclasses.asdict(loop.stopped)
        logger.warning(loop.stopped.line(launch.mode.resume_hint))
        launch.mode.stopped(lock, loop.stopped)
    history.finish(summary)
    runner.wait_recorded()  # the last block's task runs, recorded while the run closed (FlowRunner.block_ran)
    return summary


def _export(
    launch: Launch, roles: RoleHandles, loop: FlowIterationLoop, last_commit: CommittedBoundary | None
) -> tuple[str | None, str | None]:
    """The final model, when every iteration is committed and no stop came first; also a
    rerun of a run stopped before its export, which only exports (S-STOP-4). The export
    is written aside and renamed when whole. Returns it and the last boundary."""
    config, paths, stop = launch.config, launch.paths, launch.stop
    progress = stop.progress
    last_iteration, last_boundary = (
        (last_commit.iteration, last_commit.path) if last_commit else (progress.committed, progress.boundary)
    )
    if stop.signalled() and loop.stopped is None:  # after the last iteration's end, before the export
        stop.stopped_at(last_iteration, last_boundary)
    if loop.stopped is not None or not last_boundary or last_iteration != config.rl.max_steps or (
        last_commit is None and os.path.isdir(paths.final_model)
    ):
        return None, last_boundary
    progress.doing, progress.iteration = "the final export", None
    exported = export(config.rl.max_steps, last_boundary, paths.final_model, roles.policy)
    if stop.signalled():  # during the export, which finished within the grace
        stop.stopped_at(last_iteration, last_boundary)
    return exported, last_boundary


def _on_failure(action: Callable[[Exception], None]) -> Callable[..., bool]:
    """An exit callback of the run's stack that acts only when the attempt fails."""
    def on_exit(exc_type: type[BaseException] | None, error: BaseException | None, traceback: Any) -> bool:
        if isinstance(error, Exception):
            action(error)
        return False

    return on_exit


def _wait_recorded(runner: FlowRunner) -> None:
    """A failure after the last block (the export) still shows all that block's task runs;
    never in place of the run's own error."""
    try:
        runner.wait_recorded()
    except Exception as wait_error:
        get_run_logger().warning(f"could not confirm the last block's task runs were recorded: {wait_error!r}")
