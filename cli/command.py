"""`python -m flows.ppo --config FILE [--validate-manifest] [--fresh | --resume-from iter_NNNNNN] [-- key=value ...]`.

A launch is refused before the Prefect API or Ray start (seconds, not the half minute
the embedded API takes) when the config cannot run here (rundir/preflight.py). A run
that fails ends on the failing stage's task-run name and the way to resume.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from configs.loading import ConfigError, allow_profile_dir
from cli.arguments import parse_args, warmup_override
from processes.ray_session import RayAuthRefused, prepare_ray_auth

if TYPE_CHECKING:
    from flows.launch import Launch

EXIT_FAILED = 1  # a stage failed: resumable
EXIT_REFUSED = 2  # config, resume point or checkpoint refused: nothing ran
RESUME_HINT = "run it again to resume from the last committed boundary"
HEARTBEAT_SETTINGS = ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")  # and legacy name


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    overrides = overrides + warmup_override(args)
    if args.validate_manifest:
        # The manifest reports in its own every-problem format and must not import
        # Prefect or Ray (S-RUN-3).
        from cli.manifest import validate_manifest

        return validate_manifest(args.config, overrides)
    from checkpoint.boundary import CheckpointError
    from flows.launch import plan_launch
    from flows.launch_mode import ByCommand
    from rundir.resume import ResumeError
    from rundir.run_lock import RunLock, RunLocked

    # The operator named this file on their own command line: the flow it starts
    # here may load it, wherever it lives (a deployment's parameter may not, S-SEC-2).
    allow_profile_dir(Path(args.config).parent)
    try:
        # The run's set-up, once: config, directory, resume point (the flow takes it as it is).
        launch = plan_launch(args.config, overrides, None, None, resume=not args.fresh, resume_from=args.resume_from)
        launch.mode = ByCommand()  # from the first line: this command says what a stop kept
        config = launch.config
        # Before anything imports Ray: it reads its auth settings once, at import (S-SEC-1).
        prepare_ray_auth(joins_cluster=bool(config.grid.ray_address or os.environ.get("RAY_ADDRESS")))
        # S-FAULT-4: a live run of this name is refused before any service starts; the
        # lock taken here is the one the flow holds.
        lock = launch.lock = RunLock.of_run(config, launch.paths).acquire()
    except ConfigError as error:
        return refuse(error.problems)
    except (RunLocked, RayAuthRefused, ResumeError, CheckpointError) as error:
        return refuse([str(error)])
    try:
        if launch.finished:  # a finished run relaunched starts neither Prefect nor Ray
            print(f"done: {launch.finished_line()}", flush=True)
            return 0
        from processes.temporary_api import launch_early

        early_api = launch_early()  # before this process imports Prefect (processes/temporary_api.py)
        print(f"ppo: run {config.job.name!r}, {config.rl.max_steps} iterations, outputs in {launch.paths.run_dir}",
              flush=True)
        if launch.packer:
            print(f"packer: {launch.packer}", flush=True)
        for note in launch.profile_notes:
            print(f"note: {note}", flush=True)
        if config.rl.weight_sync_transport != "object_store":
            from cli.manifest import describe_transport

            print(f"weight sync: {describe_transport(config)}", flush=True)
        return run_flow(args, overrides, launch, early_api)
    finally:
        lock.release()  # nothing when the flow released it already


def run_flow(args, overrides: list[str], launch: Launch, early_api=None) -> int:
    """The flow, with everything it waits for started at once rather than one after
    another: the temporary Prefect API first (the longest to come up), then Ray with
    its fork server and the role actors, and only then does this process import the
    flow, which takes `launch` with the actors in it. Everything this process started
    is stopped before the caller prints its last line."""
    from flows.launch_mode import hard_stop_of
    from flows.stopping import stop_signals
    from processes.temporary_api import start_temporary_api

    api = start_temporary_api(early_api)
    stop = launch.stop
    stop.hard_stop = hard_stop_of(launch)  # the flow's own, from here on (flows/launch_mode.py)
    # One stack owns what this command started, closed in reverse on every way out, as
    # the flow's own stack closes what an attempt started (flows/training.py `_train`).
    with contextlib.ExitStack() as owned:
        # S-STOP-4: a signal from here on asks the run to stop, start-up included; the flow
        # installs the same handler again over the one Prefect's engine installs.
        owned.enter_context(stop_signals(stop))
        owned.enter_context(temporary_api_settings(api))
        owned.callback(stop.done)  # last: the run has ended, the grace timer with it
        if api is not None:
            owned.callback(api.stop)
        owned.callback(_close_ray, launch)
        owned.callback(_discard_unadopted, launch)
        owned.callback(drain_prefect)  # first: before the temporary API (if any) stops
        return _run_flow(args, overrides, launch, api)


def _close_ray(launch: Launch) -> None:
    if launch.ray is not None:  # started or joined by this command
        launch.ray.close()


def _discard_unadopted(launch: Launch) -> None:
    unadopted = launch.adopt_actors()
    if unadopted is not None:  # a flow refused (or stopped) before it took them
        from processes.actors import discard_launched

        discard_launched(unadopted)


def _run_flow(args, overrides: list[str], launch: Launch, api) -> int:
    from flows.stopping import take_sigterm_back
    from processes.ray_session import connect_ray
    from processes.temporary_api import TemporaryApiFailed

    stop = launch.stop
    started = time.perf_counter()
    with _importing_beside("processes.actors"):  # torch and the role classes, while Ray's daemons start
        launch.ray = connect_ray(launch.config, launch.code_dirs)
    take_sigterm_back(stop)
    if stop.signalled():
        return stopped_before_the_flow(launch)
    from processes.actors import ActorStartupError, launch_role_actors

    launch.actors = launch_role_actors(launch.config)
    joined = launch.ray is not None and launch.ray.address is not None
    print(f"ray: {'joined the Ray cluster' if joined else 'started a local Ray'} and launched the role "
          f"actors in {time.perf_counter() - started:.1f} s", flush=True)
    if stop.signalled():
        return stopped_before_the_flow(launch)
    from checkpoint.boundary import CheckpointError
    from prefect.exceptions import CancelledRun

    from flows.failures import StageFailed, failure_lines
    from rundir.resume import ResumeError
    from rundir.run_lock import RunLocked
    from flows.launch import handed_to_the_flow
    from flows.training import ppo
    from placement.ray_lowering import PlacementError

    try:
        if api is not None:
            from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

            # S-STOP-4: a stop while the API comes up is honoured there, not after it.
            if not api.wait_until_up(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(), stop.signalled):
                return stopped_before_the_flow(launch)
        with handed_to_the_flow(launch):
            summary = ppo(profile=args.config, overrides=overrides, resume=not args.fresh,
                          resume_from=args.resume_from)
    except ConfigError as error:
        return refuse(error.problems)
    except (ResumeError, CheckpointError, RunLocked, PlacementError) as error:
        # Refusals about the run's own state or the cluster's: the message is the whole story.
        return refuse([str(error)])
    except TemporaryApiFailed as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except CancelledRun:
        if launch.stop.outcome is None:  # cancelled by something else than a stop request
            raise
        print(launch.stop.outcome.line(), file=sys.stderr, flush=True)
        return launch.stop.outcome.exit_code()
    except (StageFailed, ActorStartupError) as error:
        # The traceback is above (Prefect logs it) and in the UI; end on where it broke,
        # and on what to do: resume past a fault, fix what a rerun would hit again (S-BYO-3).
        print("\n".join(failure_lines(error, RESUME_HINT) or [f"error: {error}"]), file=sys.stderr, flush=True)
        return EXIT_FAILED
    print_summary(summary)
    return 0


def stopped_before_the_flow(launch: Launch) -> int:
    """A stop while Ray and the actors started: the run's last committed boundary (if
    any) is where it stands; nothing ran that could be kept."""
    point = launch.resume_point
    stopped = launch.stop.stopped_at(point.iteration if point else 0, point.boundary if point else None)
    print(stopped.line(), file=sys.stderr, flush=True)
    return stopped.exit_code()


@contextlib.contextmanager
def _importing_beside(module: str) -> Iterator[None]:
    """Import `module` in a thread while the body runs: starting Ray spends most of its
    time waiting for its daemons, and the actors cannot be launched before their classes
    are imported. An import that fails here fails again, with its traceback, where the
    module is next imported."""
    import ray  # every module both sides import is complete before the thread starts

    del ray
    importer = threading.Thread(target=_import_quietly, args=(module,), name=f"import {module}", daemon=True)
    importer.start()
    try:
        yield
    finally:
        importer.join()


def _import_quietly(module: str) -> None:
    try:
        importlib.import_module(module)
    except BaseException:  # reported by the next import of the same module
        pass


@contextlib.contextmanager
def temporary_api_settings(api) -> Iterator[None]:
    """This process's Prefect settings pointed at the temporary API for the whole command,
    the one place it is configured: the flow's client, and the last logs and events
    drained after the flow, all read it (Prefect's settings are read once, at import,
    so the environment would be too late). Nothing connects before the flow, which
    first waits for the API to answer.

    Against it the flow runs send no heartbeats (unless PREFECT_FLOWS_HEARTBEAT_FREQUENCY
    is set): a heartbeat lets a server mark a run crashed when its process stops
    sending them, and this server stops with this process, so none could ever be
    missed; each flow run's end waited up to a second for its heartbeat thread
    (Prefect 3.9 sleeps it in whole seconds), two per run. Runs against a standing
    server (deployments, `make serve`) keep them."""
    if api is None:
        yield
        return
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    settings: dict = {PREFECT_API_URL: api.api_url}
    if not any(key in os.environ for key in HEARTBEAT_SETTINGS):
        settings[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
    with temporary_settings(settings):
        yield


def drain_prefect(timeout_s: float = 5.0) -> None:
    """Send the flow's last logs and events now, whichever API they go to (a standing
    one or the command's own, which stops with it): queued, they would be sent only
    by Prefect's exit handlers, or retried for a minute against a stopped API."""
    if "prefect.logging.handlers" not in sys.modules:  # the command never got as far as Prefect
        return
    from compat.prefect_compat import drain_logs_and_events

    drain_logs_and_events(timeout_s)


def refuse(problems: list[str]) -> int:
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr, flush=True)
    return EXIT_REFUSED


def print_summary(summary: dict) -> None:
    print("")
    print(f"done: run {summary['run_name']} at policy_version {summary['policy_version']}")
    if summary.get("actor_untouched"):
        print("  the actor was never updated (critic warmup covered every iteration; policy_version 0)")
    if summary.get("first_reward_mean") is not None:
        n = summary["reward_window"]
        first, last = summary["first_reward_mean"], summary["last_reward_mean"]
        print(f"  reward: first-{n} mean {first:.3f} -> last-{n} mean {last:.3f} (rise {last - first:+.3f})")
    if summary.get("first_val_reward") is not None:
        first, last = summary["first_val_reward"], summary["last_val_reward"]
        print(f"  held-out {summary['val_metric']} ({summary['val_metric_meaning']}): {first:.3f} at iteration "
              f"{summary['first_val_iteration']} -> {last:.3f} at iteration {summary['last_val_iteration']} "
              f"(rise {last - first:+.3f})")
    print(f"  metrics:     {summary['run_dir']}/metrics.jsonl")
    print(f"  checkpoints: {summary['run_dir']}/checkpoints (last committed: {summary['last_boundary']})")
    if summary.get("final_model"):
        print(f"  final model: {summary['final_model']['policy']} (load with transformers' from_pretrained)")
