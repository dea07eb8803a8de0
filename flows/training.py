"""The `ppo` flow: one Prefect flow run is one training run.

Set-up (config, resume point, Ray, role actors), then the iterations (flows/iteration.py,
one Prefect task per stage), then the final export and the run's summary. Parameters
are flat so the Prefect UI form and `prefect deployment run --params` can set them.
The command line (`python -m flows.ppo`) is cli/command.py.
"""

from __future__ import annotations

from processes import ray_auth_first  # noqa: F401  (before anything below imports Ray)

import dataclasses
import os
import threading
import time
from typing import Any, Callable

from prefect import flow, get_run_logger
from prefect.states import Cancelled, Completed

from compat.prefect_compat import quiet_cancelled_run_error
from configs.schema import PPOConfig
from contracts.artifact_keys import artifact_key
from flows.auto_resume import crash_resumes
from flows.failures import StageFailed
from flows.run_report import progress_line, run_summary, say, stopped_summary
from views.history import RunHistory
from flows.iteration import first_step
from flows.launch import Launch, handed_launch, take_launch
from flows.stopping import RESUME_BY_COMMAND, RESUME_IN_THE_UI, Stopped, StopRequest, stop_signals, take_sigterm_back
from rundir.resume import find_resume_point, verify_resume_point
from rundir.run_config import DEFAULT_PROFILE, resolve_config
from rundir.run_lock import RunLock
from rundir.run_outputs import append_metrics, read_metrics
from flows.flow_runner import FlowIterationLoop, FlowRunner
from flows.iteration_loop import open_run_dir, resume_roles
from views.trackers import open_trackers
from placement.nodes import describe_layout, node_addresses
from processes.actors import kill_run_actors, start_role_actors, startup_timeout, stop_role_actors
from tasks.prefect_tasks import export
from processes.ray_session import connect_ray, end_local_ray, shutdown_ray

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
    logger = get_run_logger()
    say(f"prefect: flow run {_flow_run_label()} started")
    # A run the automation rescheduled after a crash resumes, whatever it was started with.
    attempt = crash_resumes(auto_resume_attempts)
    launch = take_launch(profile, overrides, critic_warmup_iterations, run_name, resume=resume or attempt > 0,
                         resume_from=resume_from if attempt == 0 else None)
    config, paths = launch.config, launch.paths
    if launch.finished:  # nothing to train or export; Ray is never started
        say(f"done: {launch.finished_line()}")
        return Completed(message=launch.finished_line())
    if handed_launch() is None and launch.packer:
        say(f"packer: {launch.packer}")
    # S-FAULT-4: one writer per run directory, taken before anything is read or written
    # (by the command line, before it started any service, when it launched this run).
    lock = launch.lock or RunLock.of_run(config, paths)
    if lock.holder is None:
        lock.acquire()
    lock.renew(flow_run=_flow_run_label())
    if lock.took_over is not None:
        logger.warning(f"took over the run lock of a run that is no longer alive: {lock.took_over.describe()}")
    # S-STOP-4: a stop is honoured from here to the end, start-up and export included.
    try:
        with stop_signals(launch.stop, in_a_flow=True):
            while True:
                try:
                    summary = _train(launch, lock, first_attempt=attempt == 0)
                    stopped = summary.get("stopped")
                    if not stopped:
                        return summary
                    if handed_launch() is None:  # a deployment's run: no ERROR in its logs for a clean stop
                        quiet_cancelled_run_error()
                    # S-STOP-2: a stopped run ends Cancelled, which the crash automation never restarts.
                    return Cancelled(message=Stopped(**stopped).line(_resume_hint()))
                except StageFailed as error:
                    if attempt >= auto_resume_attempts or launch.stop.signalled() is not None or error.repeats:
                        raise
                    attempt += 1
                    say(f"auto-resume: attempt {attempt} of {auto_resume_attempts} after `{error}`; "
                        "resuming from the last committed boundary")
    finally:
        lock.release()
        if handed_launch() is None:  # a deployment's run ends here; the command line ends it itself
            launch.stop.done()


def _resume_hint() -> str:
    """How to run a stopped run again, as its reader can: a command-line run's reader has
    the command; a deployment's reads the Prefect UI."""
    return RESUME_BY_COMMAND if handed_launch() is not None else RESUME_IN_THE_UI


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
    open_run_dir(paths, resume_point)
    stop = launch.stop
    started = time.perf_counter()
    # Ray is connected once: by the command line that handed this launch over, else here.
    started_ray = False if handed_launch() is not None else connect_ray(config)
    take_sigterm_back(stop)
    say(
        f"ray: {'started a local Ray' if started_ray else 'using the connected Ray'} "
        f"in {time.perf_counter() - started:.1f} s"
    )
    roles = None
    runner = None
    history = None
    trackers = None
    kept = (resume_point.iteration, resume_point.boundary) if resume_point else (0, None)
    progress = stop.progress
    progress.kept(*kept)
    try:
        stop.hard_stop = hard_stop_of(config, stop)
        if stop.signalled():  # S-STOP-4: stopped while Ray started; nothing of the run ran yet
            return stopped_summary(config, paths, stop.stopped_at(*kept))
        progress.doing = "the start of the role actors"
        roles = start_role_actors(config, startup_timeout(config.rl.stage_timeout_seconds), launch.adopt_actors())
        if stop.signalled():  # while the actors started
            return stopped_summary(config, paths, stop.stopped_at(*kept))
        slowest = sorted(roles.ready_seconds.items(), key=lambda item: item[1])
        say(f"actors: {len(slowest)} ready in {slowest[-1][1]:.1f} s ("
            + ", ".join(f"{label} {seconds:.1f}" for label, seconds in slowest) + ")")
        runner = FlowRunner(
            roles, stage_timeout_s=config.rl.stage_timeout_seconds, samples_key=artifact_key(config.job.name, "samples")
        )
        runner.running = progress.stages
        if len(node_addresses()) > 1:  # on a cluster: where the plan put each role (S-RUN-4, S-TEAM-2)
            say(f"nodes: {describe_layout(runner.layout())}")
        if resume_point:
            progress.doing = f"the restore of {resume_point.boundary}"
        resumed = resume_roles(runner, roles, config, paths, resume_point)
        policy_version = resumed.policy_version or 0
        if resume_point:
            say(
                f"resume: from {resume_point.boundary} "
                f"(iteration {resume_point.iteration}, policy_version {policy_version})"
            )
        if stop.signalled():  # during the restore: the boundary it restored is still the last one
            return stopped_summary(config, paths, stop.stopped_at(*kept))
        start = resumed.start
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
        loop.in_flight = resumed.in_flight
        policy_version, last_commit = loop.run_iterations(start, config.rl.max_steps, policy_version)
        last_boundary = last_commit.path if last_commit else kept[1]
        last_iteration = last_commit.iteration if last_commit else kept[0]
        if stop.signalled() and loop.stopped is None:  # after the last iteration's end, before the export
            stop.stopped_at(last_iteration, last_boundary)
        exported = None
        if loop.stopped is None and last_boundary and last_iteration == config.rl.max_steps and (
            last_commit is not None or not os.path.isdir(paths.final_model)
        ):
            # Also a rerun of a run stopped before its export: every iteration committed, so
            # it only exports (S-STOP-4). The export is written aside and renamed when whole.
            progress.doing, progress.iteration = "the final export", None
            exported = export(config.rl.max_steps, last_boundary, paths.final_model, roles.policy)
            if stop.signalled():  # during the export, which finished within the grace
                stop.stopped_at(last_iteration, last_boundary)
        summary = run_summary(config, paths, roles, runner, policy_version, last_boundary, exported)
        summary["resumed_from"] = resume_point.boundary if resume_point else None
        if loop.stopped is not None:
            summary["stopped"] = dataclasses.asdict(loop.stopped)
            logger.warning(loop.stopped.line(_resume_hint()))
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


HARD_STOP_KILL_S = 2.0  # of the shutdown margin, for killing the run's actors by name on a cluster


def _quietly(function: Callable[..., Any], *args: Any) -> None:
    try:
        function(*args)
    except Exception:  # noqa: BLE001  (a hard stop exits whatever failed)
        pass


def hard_stop_of(config: PPOConfig, stop: StopRequest) -> Callable[[str], None]:
    """What a second signal or the end of the grace does: kill the run's actors (on a
    cluster they would outlive this process) and exit now; the last committed boundary
    stands, as after any crash."""
    def hard_stop(why: str) -> None:
        # Bounded: with its raylet gone, Ray's calls wait for it (S-STOP-5), and the exit
        # must happen whatever the cluster says.
        killer = threading.Thread(target=_quietly, args=(kill_run_actors, config.job.name), daemon=True)
        killer.start()
        killer.join(HARD_STOP_KILL_S)
        _quietly(end_local_ray)  # S-STOP-5: nothing this process started outlives it
        stop.exit_now(why)

    return hard_stop
