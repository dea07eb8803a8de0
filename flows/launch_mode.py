"""How a run was launched, as behaviour: from the command line (`python -m flows.ppo`,
which starts the services, connects Ray and prints the run's first and last lines
itself) or as a deployment's flow run (a worker started the process; the flow run
connects Ray, says everything in its logs and reports a stop on the flow run itself).
The `ppo` flow asks its launch's mode and never branches on where it came from. Imports
no Prefect at module level: the command line plans its launch before Prefect loads.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from flows.stopping import RESUME_BY_COMMAND, RESUME_IN_THE_UI, Stopped

if TYPE_CHECKING:
    from configs.schema import PPOConfig
    from flows.stopping import StopRequest
    from processes.ray_session import RaySession
    from rundir.run_lock import RunLock


class LaunchMode(Protocol):
    resume_hint: str  # how the run's reader runs it again

    def announce(self, packer: str | None, notes: Sequence[str]) -> None:
        """The launch's own lines (the packer, notes on the profile's folder)."""

    def connect_ray(self, config: PPOConfig, code_dirs: Sequence[str]) -> RaySession | None:
        """The Ray session this flow run connects (its processes importing `code_dirs`),
        or None when its launcher did."""

    def failed(self, error: Exception) -> None:
        """A failed run's last words, where its reader looks."""

    def stopped(self, lock: RunLock, stopped: Stopped) -> None:
        """A stopped run's outcome, said as soon as what it keeps is known."""

    def hard_stop_says(self, stop: StopRequest, why: str) -> list[Callable[[], None]]:
        """What a hard stop says before the process exits (bounded, run beside the kill)."""

    def clean_stop(self) -> None:
        """A stop that ended the run cleanly, as the run's logs should show it."""

    def ended(self, stop: StopRequest) -> None:
        """The flow run is over; what its launcher would otherwise close."""


class ByCommand:
    """`python -m flows.ppo`: the command line printed the launch's lines, connected Ray,
    prints the failure and the stop line, and ends the stop's grace timer itself."""

    resume_hint = RESUME_BY_COMMAND

    def announce(self, packer: str | None, notes: Sequence[str]) -> None:
        return None

    def connect_ray(self, config: PPOConfig, code_dirs: Sequence[str]) -> RaySession | None:
        return None

    def failed(self, error: Exception) -> None:
        return None

    def stopped(self, lock: RunLock, stopped: Stopped) -> None:
        return None

    def hard_stop_says(self, stop: StopRequest, why: str) -> list[Callable[[], None]]:
        return []

    def clean_stop(self) -> None:
        return None

    def ended(self, stop: StopRequest) -> None:
        return None


class ByDeployment:
    """A deployment's flow run: everything is said in the run's logs and on its state,
    which is all its reader (the Prefect UI, `--watch`) sees."""

    resume_hint = RESUME_IN_THE_UI

    def announce(self, packer: str | None, notes: Sequence[str]) -> None:
        from flows.run_report import say  # Prefect's logger: imported only once the flow runs

        if packer:
            say(f"packer: {packer}")
        for note in notes:
            say(f"note: {note}")

    def connect_ray(self, config: PPOConfig, code_dirs: Sequence[str]) -> RaySession | None:
        from processes.ray_session import connect_ray

        return connect_ray(config, tuple(code_dirs))

    def failed(self, error: Exception) -> None:
        """S-BYO-2: the lines a command-line run ends on (`error: <cause>` and what to do),
        logged last and sent before the run is marked Failed: `prefect deployment run
        --watch` shows them just above its last line, and the UI's logs end on them."""
        from flows.failures import failure_lines

        lines = failure_lines(error, f"{RESUME_IN_THE_UI} to resume from the last committed boundary")
        if lines is None:
            return
        try:
            from prefect import get_run_logger
            from prefect.logging.handlers import APILogHandler

            get_run_logger().error("\n".join(lines))
            APILogHandler().flush()
        except Exception as logging_error:  # noqa: BLE001  (the run's own error is what it raises)
            print(f"could not log the run's failure: {logging_error!r}", file=sys.stderr, flush=True)

    def stopped(self, lock: RunLock, stopped: Stopped) -> None:
        """S-STOP-2: marked Cancelled, with its stop line, before its records, actors and
        Ray close: a worker that runs out of grace (30 s) while they close then kills a
        run that already says what it committed. A rerun pressed meanwhile waits for the
        close (`RunLock.closing`)."""
        lock.closing()
        mark_cancelled(stopped.line(RESUME_IN_THE_UI))

    def hard_stop_says(self, stop: StopRequest, why: str) -> list[Callable[[], None]]:
        """S-STOP-4: what it kept or lost, on its flow run, before its worker's SIGKILL."""
        line = stop.outcome.line(RESUME_IN_THE_UI) if stop.outcome else stop.progress.lost(why, RESUME_IN_THE_UI)
        return [lambda: mark_cancelled(line)]

    def clean_stop(self) -> None:
        from compat.prefect_compat import quiet_cancelled_run_error

        quiet_cancelled_run_error()  # no ERROR in its logs for a clean stop

    def ended(self, stop: StopRequest) -> None:
        stop.done()  # the run has ended: the grace timer with it


def mark_cancelled(line: str) -> None:
    """This flow run's state, Cancelled with `line`, set now."""
    from prefect import get_client
    from prefect.runtime import flow_run
    from prefect.states import Cancelled

    if not flow_run.id:
        return
    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Cancelled(message=line))
    except Exception as error:  # the flow's own return (or the worker) still ends the run
        print(f"stop: could not mark the flow run Cancelled ahead of its close: {error}", file=sys.stderr, flush=True)


class Stoppable(Protocol):
    """What a hard stop needs of a launch (flows/launch.py `Launch`)."""

    config: PPOConfig
    stop: StopRequest
    mode: LaunchMode
    ray: RaySession | None


HARD_STOP_KILL_S = 2.0  # of the shutdown margin, for killing the run's actors by name on a cluster


def hard_stop_of(launch: Stoppable) -> Callable[[str], None]:
    """What a second signal or the end of the grace does, from the command line's first
    line to the flow's last: kill the run's actors (on a cluster they would outlive this
    process), say what was kept where the mode's reader looks, end the Ray this launch
    started, and exit now; the last committed boundary stands, as after any crash."""
    def hard_stop(why: str) -> None:
        # Bounded: with its raylet gone, Ray's calls wait for it (S-STOP-5), and the exit
        # must happen whatever the cluster says. A deployment's run says first, on its
        # flow run, what it kept or lost (S-STOP-4): its worker's SIGKILL follows.
        jobs = [threading.Thread(target=_quietly, args=(says,), daemon=True)
                for says in launch.mode.hard_stop_says(launch.stop, why)]
        if _ray_connected():  # never starts a Ray just to look for actors
            from processes.actors import kill_run_actors

            jobs.append(threading.Thread(target=_quietly, args=(kill_run_actors, launch.config.job.name), daemon=True))
        deadline = time.monotonic() + HARD_STOP_KILL_S
        for job in jobs:
            job.start()
        for job in jobs:
            job.join(max(0.0, deadline - time.monotonic()))
        if launch.ray is not None:
            _quietly(launch.ray.end_now)  # S-STOP-5: nothing this process started outlives it
        launch.stop.exit_now(why)

    return hard_stop


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _quietly(function: Callable[..., Any], *args: Any) -> None:
    try:
        function(*args)
    except Exception:  # noqa: BLE001  (a hard stop exits whatever failed)
        pass
