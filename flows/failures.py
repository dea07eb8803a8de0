"""How a failed stage is named: `<stage>[iter=N] failed: <Type>: <message>`.

The name is the task run's own name in the Prefect UI, so the flow run's state, the
CLI's last line and the summary artifact all point at the task that broke. Kept
apart from the flow module so the CLI catches the very class the flow raises, however
the flow module was imported. A runner may pass `explain`, which words the faults it
knows better than the exception does (a dead actor named by its role, S-FAULT-1).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from contracts.faults import repeats_on_rerun

REPEATS_HINT = "a rerun would fail the same way: fix what the line above names first"


class StageFailed(RuntimeError):
    """A stage of an iteration raised; the original error is chained. `repeats`: the
    cause was the user's code, data, model folder or config, which a rerun would hit
    again (contracts/faults.py)."""

    def __init__(self, message: str, *, repeats: bool = False):
        super().__init__(message)
        self.repeats = repeats


def stage_run_name(stage: str, iteration: int) -> str:
    return f"{stage}[iter={iteration}]"


@contextmanager
def naming_failures(
    stage: str, iteration: int, explain: Callable[[BaseException], str | None] | None = None
) -> Iterator[None]:
    try:
        yield
    except StageFailed:
        raise
    except Exception as error:
        cause = _actor_cause(error)
        detail = (explain(cause) if explain is not None else None) or str(cause)
        raise StageFailed(
            f"{stage_run_name(stage, iteration)} failed: {type(cause).__name__}: {detail}",
            repeats=repeats_on_rerun(cause),
        ) from error


def _actor_cause(error: Exception) -> BaseException:
    """An actor's exception arrives wrapped in Ray's RayTaskError; the user wants the
    original (`ZeroDivisionError: ...`), not the wrapper's traceback dump."""
    try:
        from ray.exceptions import RayTaskError
    except ImportError:  # in-process runs need no Ray
        return error
    if isinstance(error, RayTaskError) and error.cause is not None:
        return error.cause
    return error


def failure_lines(error: BaseException, resume_hint: str) -> list[str] | None:
    """The lines a failed run ends on, as the command line prints them: `error: <cause>`
    (one per config problem), then for a failed stage what to do next, `resume_hint`
    for a fault a rerun gets past. None for an error the project does not know, whose
    traceback is its story. A deployment's run logs the same lines last (S-BYO-2), so
    `prefect deployment run --watch` and `python -m deployments.watch` end on them."""
    from configs.loading import ConfigError

    if isinstance(error, ConfigError):  # every problem, each under its key
        return [f"error: {problem}" for problem in error.problems]
    if isinstance(error, RuntimeError) and isinstance(getattr(error, "repeats", None), bool):
        # a failed stage, or role actors that never started (StageFailed, ActorStartupError)
        return [f"error: {error}", f"  {REPEATS_HINT if error.repeats else resume_hint}"]
    if isinstance(error, _refusals()):  # the run's own state or the cluster's: the message is the story
        return [f"error: {error}"]
    return None


def _refusals() -> tuple[type[BaseException], ...]:
    """Refusals about the run's own state or the cluster's (none of their modules
    imports Ray or torch)."""
    from checkpoint.boundary import CheckpointError
    from placement.ray_lowering import PlacementError
    from processes.ray_session import RayAuthRefused
    from rundir.resume import ResumeError
    from rundir.run_lock import RunLocked

    return ResumeError, CheckpointError, RunLocked, PlacementError, RayAuthRefused
