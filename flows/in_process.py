"""The PPO iteration on role objects in this process, under the in-process runner: the
overhead baseline, fast learning curves, and the other half of the check that the flow
computes exactly what the role bodies compute.

    records, roles = run_in_process(config)   # roles.policy.model holds the final weights
"""

from __future__ import annotations

from typing import Any, Callable

from configs.schema import PPOConfig
from flows.in_process_roles import InProcessRoles, build_roles
from flows.iteration import first_step
from flows.iteration_loop import IterationLoop, open_run_dir, resume_roles
from flows.stopping import stop_request, stop_signals
from rundir.resume import find_resume_point
from rundir.run_identity import RunIdentity
from rundir.run_lock import RunLock
from rundir.run_outputs import RunPaths, append_metrics
from flows.in_process_runner import InProcessRunner
from views.trackers import Trackers, open_trackers


def run_in_process(
    config: PPOConfig,
    max_steps: int | None = None,
    *,
    roles: InProcessRoles | None = None,
    start: int = 1,
    paths: RunPaths | None = None,
    resume: bool = False,
    resume_from: str | None = None,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], InProcessRoles]:
    """Run iterations `start..max_steps` (default `rl.max_steps`); return one metric
    record per iteration, with the keys the flow writes to metrics.jsonl, and the roles.

    Args:
        config: the run configuration (the same object the flow would resolve).
        max_steps: last outer iteration to run; None means `config.rl.max_steps`.
        roles: role objects to drive; built from `config` when None. Pass your own
            to continue them or inspect them afterwards (weights, optimizer, cursor).
        start: first outer iteration (1 for a fresh run).
        paths: write the run there as the flow does (boundaries on the save cadence,
            metrics.jsonl); None writes nothing.
        resume: with `paths`, continue from the run's last committed boundary exactly
            as the flow does (rundir/resume.py); `start` is then the iteration after it.
        resume_from: with `paths`, go back to this earlier committed boundary
            (`iter_000010`) instead, as the flow's parameter of that name does.
        on_iteration: called with each record as soon as it is complete.
    """
    roles = build_roles(config) if roles is None else roles
    records: list[dict[str, Any]] = []
    trackers = Trackers()

    def keep(record: dict[str, Any]) -> None:
        records.append(record)
        if paths is not None:
            append_metrics(paths.metrics, record)
            trackers.log(record)
        if on_iteration is not None:
            on_iteration(record)

    runner = InProcessRunner()
    policy_version = roles.policy.policy_version
    last = config.rl.max_steps if max_steps is None else max_steps
    if paths is None:
        IterationLoop(runner, roles, config, None, keep).run_iterations(start, last, policy_version)
        return records, roles
    with RunLock.of_run(config, paths, "in-process"):  # one writer per run directory, as the flow
        identity = RunIdentity.at_launch(config)  # as a launch reads it: once (rundir/run_identity.py)
        point = find_resume_point(config, paths, resume=resume, resume_from=resume_from, identity=identity)
        open_run_dir(paths, point)
        resumed = resume_roles(runner, roles, config, paths, point)
        start = resumed.start if point is not None else start
        policy_version = policy_version if resumed.policy_version is None else resumed.policy_version
        trackers = open_trackers(config, paths, first_step(config, start))  # as the flow (views/trackers.py)
        loop = IterationLoop(runner, roles, config, paths, keep, stop=stop_request(config))
        loop.in_flight, loop.identity = resumed.in_flight, identity
        try:
            with stop_signals(loop.stop):
                loop.run_iterations(start, last, policy_version)
        finally:
            loop.stop.done()
            trackers.close()
    return records, roles
