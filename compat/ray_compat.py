"""Ray's private internals, used only on the Ray versions they were written against.

Two start-up and shutdown cuts of a local Ray need them (docs/architecture.md, "How a
run starts"): the raylet's Python replaced by the fork launcher while `ray.init`
starts the daemons (the launcher forks the one command that runs Ray's worker script),
and the autoscaler monitor stopped before the GCS. The run also asks each actor where
it is through Ray's `__ray_call__`. Outside `WRITTEN_FOR` the workers start as Ray
starts them, the monitor is left to `ray.shutdown()`, and a failure names no node:
slower or less precise, never wrong.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from packaging.specifiers import SpecifierSet

from compat.versions import within

WRITTEN_FOR = SpecifierSet(">=2.60,<2.61")


def internals_usable(what: str, public_path: str) -> bool:
    return within("ray", WRITTEN_FOR, what, public_path)


def attach_to_node(temp_dir: str | None) -> dict[str, Any]:
    """`ray.init` keywords that attach this driver to the node whose temp dir is
    `temp_dir` (the zero-capacity node a join script started, S-TEAM-2) rather than to
    any node on the host: Ray's private `_temp_dir`. Outside `WRITTEN_FOR` the driver
    attaches where Ray picks, which on a host with one node is that node."""
    if temp_dir is None or not internals_usable("attaching the driver to the joined node", "the node Ray picks"):
        return {}
    return {"_temp_dir": temp_dir}


# The script, in ray/_private/workers/, that a raylet's command for each Python worker
# runs: the one command the fork launcher forks (processes/fork_client.py).
WORKER_SCRIPT = "default_worker.py"


def fork_launch_supported() -> bool:
    """Whether a local Ray's workers can be forked from the fork server (they need the
    launcher to stand in for the raylet's `python`, see `worker_python`)."""
    return internals_usable("forking workers from the fork server", "workers start as Ray starts them")


def worker_script() -> str | None:
    """The file name of Ray's worker script for the fork client to recognise, or None
    (outside `WRITTEN_FOR`: no command is taken for a worker, each runs as plain Python)."""
    return WORKER_SCRIPT if fork_launch_supported() else None


@contextlib.contextmanager
def worker_python(launcher: str | None) -> Iterator[None]:
    """While a local Ray starts: `launcher` as the `sys.executable` that Ray's process
    starter puts in the commands of the daemons it starts (Ray has no setting for it;
    the raylet runs that Python for every worker). Put back afterwards, so nothing but
    that starter sees it."""
    if launcher is None or not fork_launch_supported():
        yield
        return
    from ray._private import services

    real_sys = services.sys
    services.sys = _SysWithExecutable(real_sys, launcher)
    try:
        yield
    finally:
        services.sys = real_sys


@contextlib.contextmanager
def daemons_in_sessions_of_their_own() -> Iterator[None]:
    """While a local Ray starts: every process Ray's process starter launches (the GCS,
    the raylet, the monitors) starts in a session of its own (S-STOP-5). The raylet
    answers SIGTERM by unregistering its node and sending SIGTERM to every worker, and
    the GCS by stopping: in the run's process group, a stop signal for the whole group
    (a Prefect worker's Cancel, `timeout`, Slurm) killed the actors before the commit.
    Ray has no setting for it; its starter builds each process through its own
    `ConsolePopen`. A run killed outright still takes them with it: Ray's starter
    makes the kernel kill each of them when the run's process dies (PR_SET_PDEATHSIG).
    Outside `WRITTEN_FOR` they stay in the run's group: signal the run's process
    alone (docs/stopping.md)."""
    if not internals_usable(
        "starting Ray's daemons in sessions of their own",
        "they stay in the run's process group (signal the run's process, not its group)",
    ):
        yield
        return
    from ray._private import services

    real_popen = services.ConsolePopen
    services.ConsolePopen = _popen_in_own_session(real_popen)
    try:
        yield
    finally:
        services.ConsolePopen = real_popen


def _popen_in_own_session(popen: type) -> type:
    class PopenInOwnSession(popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    return PopenInOwnSession


class _SysWithExecutable:
    """`sys`, but with another `executable`."""

    def __init__(self, real_sys: Any, executable: str) -> None:
        self._real_sys = real_sys
        self.executable = executable

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real_sys, name)


def stop_autoscaler_monitor() -> None:
    """Kill the autoscaler monitor of a Ray this process started, before `ray.shutdown()`
    stops the GCS: the monitor answers SIGTERM by reporting to that GCS and, with it
    gone, hangs until Ray kills it. A local Ray never autoscales, so nothing is lost.
    Best effort: a failure here must not keep the rest of the shutdown from running."""
    if not internals_usable("stopping the autoscaler monitor first", "ray.shutdown() stops it"):
        return
    try:
        from ray._private import worker

        node = worker._global_node
        if node is not None and node.head:  # a Ray this process started, not a joined cluster
            node.kill_monitor(check_alive=False)
    except Exception as error:  # noqa: BLE001  (ray.shutdown() stops it the slow way)
        print(f"ray: could not stop the autoscaler monitor first: {type(error).__name__}: {error}",
              file=sys.stderr, flush=True)


def call_inside(actor: Any, function: Any) -> Any | None:
    """`function(instance)` run inside `actor`'s process, whatever its class (Ray's
    undocumented `__ray_call__`): an ObjectRef, or None outside `WRITTEN_FOR`, where
    the caller does without the answer."""
    if not internals_usable("asking an actor where it runs", "failures are named without the actor's node"):
        return None
    return actor.__ray_call__.remote(function)


def current_actor() -> str | None:
    """The Ray actor id of the calling process; None in a driver or a task (public API)."""
    import ray

    return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
