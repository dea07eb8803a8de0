"""The in-process way of running the iteration program (flows/iteration.py): role calls
on plain objects in this process, run in the order they were queued, and each stage
body (tasks/stages.py) called on their values. No Prefect and no Ray are imported.

It is the baseline the orchestration overhead is measured against (bench/overhead.py),
a fast learning curve, and the other half of the check that the flow computes exactly
what the role bodies compute (S-CW-3). A stage's `time/<stage>_seconds` is the compute
time of the calls it waited for.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from contracts.pending import pending_in, replace_pending
from flows.failures import naming_failures


@dataclass
class Done:
    """One in-process call's outcome, standing where Ray would hand an ObjectRef."""

    value: Any
    error: BaseException | None
    call: int
    seconds: float


class InProcessRunner:
    """Role calls on plain objects, run as they are queued; stage bodies called directly."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._calls = itertools.count()

    def start_iteration(self) -> None:
        self.seconds = {}

    def call(self, method: Callable[..., Any], *args: Any, returns: int = 1) -> Any:
        call = next(self._calls)
        failed = next((arg.error for arg in args if isinstance(arg, Done) and arg.error is not None), None)
        started = time.perf_counter()
        value: Any = None
        error = failed  # as in Ray: a call whose argument failed does not run
        if failed is None:
            try:
                value = method(*(arg.value if isinstance(arg, Done) else arg for arg in args))
            except Exception as raised:  # kept for the stage that waits on it, as Ray keeps it
                error = raised
        seconds = time.perf_counter() - started
        if returns == 1:
            return Done(value, error, call, seconds)
        values = value if error is None else (None,) * returns
        return tuple(Done(item, error, call, seconds) for item in values)

    def stage(self, body: Callable[..., Any], iteration: int, *args: Any, waits: Sequence[Any] = ()) -> Any:
        with naming_failures(body.__name__, iteration):
            values = [_value(arg) for arg in (*args, waits)][:-1]  # a failed wait raises, in argument order
            result = body(iteration, *values)
        self.seconds[body.__name__] = _compute_seconds([*args, waits])
        return result

    def concurrent_stages(
        self, label: str, iteration: int, *stages: tuple[Callable[..., Any], tuple[Any, ...]]
    ) -> list[Any]:
        results = []
        for body, args in stages:
            with naming_failures(body.__name__, iteration):
                results.append(body(iteration, *(_value(arg) for arg in args)))
        self.seconds[label] = _compute_seconds([arg for _, args in stages for arg in args])
        return results

    def start_stage(self, body: Callable[..., Any], iteration: int, *args: Any) -> Any:
        """Nothing runs beside anything in process: the stage runs at `finish_stage`."""
        return body, iteration, args

    def finish_stage(self, started: Any) -> tuple[Any, float]:
        body, iteration, args = started
        with naming_failures(body.__name__, iteration):
            result = body(iteration, *(_value(arg) for arg in args))
        return result, _compute_seconds(args)

    def get(self, pending: Any) -> Any:
        return _value(pending)


def _is_done(arg: Any) -> bool:
    return isinstance(arg, Done)


def _result(done: Done) -> Any:
    if done.error is not None:
        raise done.error
    return done.value


def _value(arg: Any) -> Any:
    """What a stage body receives: the value, or the call's error raised."""
    return replace_pending(arg, _is_done, _result)


def _compute_seconds(args: Sequence[Any]) -> float:
    """The time of every distinct call a stage waited for (one call may hand it
    several outputs)."""
    return sum({done.call: done.seconds for done in pending_in(list(args), _is_done)}.values())
