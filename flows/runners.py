"""The two ways one iteration program (flows/iteration.py) is executed.

`FlowRunner`: every role call goes to its Ray actor at once (Ray runs one actor's
calls in submission order, and a call whose argument failed does not run), and every
stage is awaited by its Prefect task, so the UI shows one task run per stage.

`InProcessRunner`: the same calls on plain role objects in this process, in the
order they were queued, and each stage task's body (`task.fn`) run without Prefect.
It is the baseline the orchestration overhead is measured against
(bench/overhead.py), a fast learning curve, and the other half of the check that the
flow computes exactly what the role bodies compute (S-CW-3).

Both name a failing stage the same way (flows/failures.py) and record the same
`time/<stage>_seconds` keys: the flow the stage task's wall time, the in-process
runner the compute time of the calls that stage waited for.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flows.failures import naming_failures


class FlowRunner:
    """Role calls on Ray actors, stages as Prefect tasks of the running flow.

    With `prefect_tasks=False` each stage's body runs directly in this process (no
    flow run needed): the actors and their call order are the flow's, without
    Prefect's bookkeeping. Tests of the actor wiring and benchmarks use it."""

    def __init__(self, prefect_tasks: bool = True) -> None:
        self.prefect_tasks = prefect_tasks
        self.seconds: dict[str, float] = {}
        self._upstream: list[Any] = []  # the previous stage's result: an arrow in the UI's graph

    def start_iteration(self) -> None:
        self.seconds = {}
        self._upstream = []

    def call(self, method: Any, *args: Any, returns: int = 1) -> Any:
        if returns == 1:
            return method.remote(*args)
        return method.options(num_returns=returns).remote(*args)

    def stage(self, stage_task: Any, iteration: int, *args: Any) -> Any:
        started = time.perf_counter()
        with naming_failures(stage_task.name, iteration):
            if self.prefect_tasks:
                result = stage_task(iteration, *args, wait_for=list(self._upstream) or None)
            else:
                result = stage_task.fn(iteration, *args)
        self.seconds[stage_task.name] = time.perf_counter() - started
        self._upstream = [result]
        return result

    def concurrent_stages(self, label: str, iteration: int, *stages: tuple[Any, tuple[Any, ...]]) -> list[Any]:
        """Stages that run side by side (the two trainers), each its own task run."""
        started = time.perf_counter()
        if not self.prefect_tasks:
            results = []
            for task, args in stages:
                with naming_failures(task.name, iteration):
                    results.append(task.fn(iteration, *args))
            self.seconds[label] = time.perf_counter() - started
            return results
        futures = [(task, task.submit(iteration, *args, wait_for=list(self._upstream) or None)) for task, args in stages]
        results = []
        for task, future in futures:
            with naming_failures(task.name, iteration):
                results.append(future.result())
        self.seconds[label] = time.perf_counter() - started
        self._upstream = [future for _, future in futures]
        return results

    def get(self, pending: Any) -> Any:
        import ray

        return ray.get(pending)


@dataclass
class Done:
    """One in-process call's outcome, standing where Ray would hand an ObjectRef."""

    value: Any
    error: BaseException | None
    call: int
    seconds: float


class InProcessRunner:
    """Role calls on plain objects, run as they are queued; stage bodies without Prefect."""

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

    def stage(self, stage_task: Any, iteration: int, *args: Any) -> Any:
        with naming_failures(stage_task.name, iteration):
            result = stage_task.fn(iteration, *(_value(arg) for arg in args))
        self.seconds[stage_task.name] = _compute_seconds(args)
        return result

    def concurrent_stages(self, label: str, iteration: int, *stages: tuple[Any, tuple[Any, ...]]) -> list[Any]:
        results = []
        for task, args in stages:
            with naming_failures(task.name, iteration):
                results.append(task.fn(iteration, *(_value(arg) for arg in args)))
        self.seconds[label] = _compute_seconds([arg for _, args in stages for arg in args])
        return results

    def get(self, pending: Any) -> Any:
        return _value(pending)


def _value(arg: Any) -> Any:
    """What a stage task's body receives: the value, or the call's error raised."""
    if isinstance(arg, Done):
        if arg.error is not None:
            raise arg.error
        return arg.value
    if isinstance(arg, (list, tuple)):
        return type(arg)(_value(item) for item in arg)
    if isinstance(arg, dict):
        return {key: _value(item) for key, item in arg.items()}
    return arg


def _compute_seconds(args: Sequence[Any]) -> float:
    """The time of every distinct call a stage waited for (one call may hand it
    several outputs)."""
    calls: dict[int, float] = {}

    def visit(arg: Any) -> None:
        if isinstance(arg, Done):
            calls[arg.call] = arg.seconds
        elif isinstance(arg, (list, tuple)):
            for item in arg:
                visit(item)
        elif isinstance(arg, dict):
            for item in arg.values():
                visit(item)

    for arg in args:
        visit(arg)
    return sum(calls.values())
