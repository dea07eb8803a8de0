"""Ray's private internals, used only on the Ray versions they were written against.

Two start-up and shutdown cuts of a local Ray need them (docs/architecture.md, "How a
run starts"): the raylet's Python replaced by the fork launcher while `ray.init`
starts the daemons, and the autoscaler monitor stopped before the GCS. Outside
`WRITTEN_FOR` the workers start as Ray starts them and the monitor is left to
`ray.shutdown()`: slower, never wrong.
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


def fork_launch_supported() -> bool:
    """Whether a local Ray's workers can be forked from the fork server (they need the
    launcher to stand in for the raylet's `python`, see `worker_python`)."""
    return internals_usable("forking workers from the fork server", "workers start as Ray starts them")


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


def current_actor() -> str | None:
    """The Ray actor id of the calling process; None in a driver or a task (public API)."""
    import ray

    return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
