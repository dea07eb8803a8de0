"""The flow's Prefect tasks: one per stage body of tasks/stages.py and tasks/commit.py.

Each task waits for the actor calls its arguments refer to (Ray object references,
bounded by `rl.stage_timeout_seconds`), then runs the body on the values and logs into
the task run. The UI therefore shows one task run per stage with its true end time,
and an actor's error fails the task of the stage that waited for it. No task caches
or persists results: resume reads committed boundaries, never Prefect results.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, Sequence

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import Task

from contracts.pending import pending_in, replace_pending
from tasks import commit, stages
from views.samples_table import publish_samples

STAGE_TASK: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False, "retries": 0}

stage_timeout: ContextVar[float | None] = ContextVar("stage_timeout", default=None)
"""Seconds a stage may wait for its actor calls, set by the flow's runner. A blocking
`ray.get` cannot be interrupted by Prefect's own task timeout, so the wait itself is
bounded (S-FAULT-1)."""


class StageTimeout(TimeoutError):
    """A stage's actor calls did not finish in time; `late` are the references still
    outstanding, in queue order: the first is the stuck call, the others may only be
    waiting for its output."""

    def __init__(self, late: list[ray.ObjectRef], seconds: float):
        self.late = late
        self.seconds = seconds
        super().__init__(f"{len(late)} actor call(s) did not finish within {seconds:g} s (rl.stage_timeout_seconds)")


def resolve(arguments: tuple[Any, ...]) -> tuple[Any, ...]:
    """`arguments` with every object reference replaced by its value: at the top level
    and inside lists, tuples and dict values, fetched in one `ray.get`, in argument
    order (the first failed call is the one raised)."""
    refs = pending_in(list(arguments), _is_ref)
    if not refs:
        return arguments
    timeout = stage_timeout.get()
    if timeout is not None:
        _, late = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if late:
            outstanding = set(late)
            raise StageTimeout([ref for ref in refs if ref in outstanding], timeout)
    fetched = iter(ray.get(refs))
    return tuple(replace_pending(argument, _is_ref, lambda _: next(fetched)) for argument in arguments)


def _is_ref(value: Any) -> bool:
    return isinstance(value, ray.ObjectRef)


samples_key: ContextVar[str | None] = ContextVar("samples_key", default=None)
"""The artifact key under which the flow's train_critic task shows a few samples (S-OPS-3)."""


def stage_task(body: Callable[..., Any]) -> Task:
    """The Prefect task `<stage>[iter=N]` that runs `body` on the values of `arguments`
    once they, and the calls in `waits` that the stage only waits for, are ready."""

    def waited(iteration: int, arguments: tuple[Any, ...], waits: Sequence[Any] = ()) -> Any:
        log = stages.stage_log.set(get_run_logger())
        view = stages.samples_view.set(lambda experience: publish_samples(experience, samples_key.get()))
        try:
            *values, _ = resolve((*arguments, list(waits)))
            return body(iteration, *values)
        finally:
            stages.samples_view.reset(view)
            stages.stage_log.reset(log)

    name = body.__name__
    return task(name=name, task_run_name=f"{name}[iter={{iteration}}]", **STAGE_TASK)(waited)


STAGE_BODIES: tuple[Callable[..., Any], ...] = (
    stages.rollout,
    stages.reward,
    stages.reference_score,
    stages.critic_predict,
    stages.prepare_batch,
    stages.train_policy,
    stages.train_critic,
    stages.weight_sync,
    stages.evaluate,
    commit.commit,
    commit.save_artifact,
)
"""Every stage body that runs as a task, in iteration order (contracts/stage_names.py
names them; a test holds the two together)."""
TASKS: dict[Callable[..., Any], Task] = {body: stage_task(body) for body in STAGE_BODIES}
"""Each stage body's task: the flow's runner looks a body up here."""


@task(name="export", task_run_name="export[iter={iteration}]", cache_policy=NO_CACHE, persist_result=False)
def export(iteration: int, boundary: str, out: str, exporter: Any) -> dict[str, str]:
    """Plain HF folders of the final boundary, written by `exporter` (the policy's
    actor, which has transformers imported already), so the flow process never loads
    model weights."""
    written = ray.get(exporter.export_boundary.remote(boundary, out))
    get_run_logger().info(f"exported {boundary} to {out}")
    return written
