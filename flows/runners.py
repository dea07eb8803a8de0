"""The two ways one iteration program (flows/iteration.py) is executed.

`FlowRunner`: every role call goes to its Ray actor at once (Ray runs one actor's
calls in submission order, and a call whose argument failed does not run), and every
stage is awaited by its Prefect task, so the UI shows one task run per stage; each
block of iterations is a subflow run (flows/blocks.py, S-OPS-1).

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
from functools import partial
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

from flows.failures import naming_failures
from placement.nodes import actor_whereabouts, is_lost, node_addresses, node_name

Result = TypeVar("Result")


class FlowRunner:
    """Role calls on Ray actors, stages as Prefect tasks of the running flow.

    With `prefect_tasks=False` each stage's body runs directly in this process (no
    flow run needed): the actors and their call order are the flow's, without
    Prefect's bookkeeping. Tests of the actor wiring and benchmarks use it.

    Given the run's actor handles, a failure names the role whose actor died or hung,
    and a stage that waits longer than `stage_timeout_s` fails and kills the actors it
    was waiting for, so nothing stuck keeps holding a device (S-FAULT-1)."""

    def __init__(self, roles: Any = None, *, prefect_tasks: bool = True, stage_timeout_s: float | None = None) -> None:
        self.prefect_tasks = prefect_tasks
        self.stage_timeout_s = stage_timeout_s
        self.seconds: dict[str, float] = {}
        self.task_runs = 0  # stage task runs started in the current block
        self._unrecorded: tuple[Any, int] | None = None  # the last block's (flow run, task runs) to wait for
        self._upstream: list[Any] = []  # the previous stage's result: an arrow in the UI's graph
        labelled = labelled_actors(roles) if roles is not None else {}
        where = actor_whereabouts(labelled) if labelled else {}
        # Ray actor id -> (the role as a user reads it, handle), and -> the node it runs on
        self._actors = {actor_id: (label, labelled[label]) for label, (actor_id, _) in where.items()}
        self._nodes = {actor_id: node for actor_id, node in where.values()}

    def layout(self) -> dict[str, list[str]]:
        """Node id -> the actors on it (role and rank), as found at start-up."""
        layout: dict[str, list[str]] = {}
        for key, node in self._nodes.items():
            layout.setdefault(node, []).append(self._actors[key][0])
        return layout

    def start_iteration(self) -> None:
        self.seconds = {}
        self._upstream = []

    def block(self, first: int, last: int, body: Callable[[], Result], last_block: bool = False) -> Result:
        """Iterations `first..last` (run by `body`) as one block subflow run of the
        running flow (flows/blocks.py). The block ends once the server has recorded
        every task run it ran (flows/recording.py), so no task run is lost; the run's
        last block leaves that wait to `wait_recorded`, which the flow calls once its
        closing work (export, summary) is done: up to a second the server needs
        anyway, no longer added to every run's end."""
        if not self.prefect_tasks:
            return body()
        from flows.blocks import run_block
        from flows.recording import wait_until_recorded
        from views.run_artifacts import artifacts_on_this_run, current_flow_run_id

        def recorded() -> Result:
            self.task_runs = 0
            result = body()
            if last_block:
                self._unrecorded = (current_flow_run_id(), self.task_runs)
            else:
                wait_until_recorded(current_flow_run_id(), self.task_runs)
            return result

        with artifacts_on_this_run():
            return run_block(first, last, recorded)

    def wait_recorded(self) -> None:
        """The last block's wait (see `block`), once; nothing when there is none."""
        if self._unrecorded is None:
            return
        from flows.recording import wait_until_recorded

        flow_run_id, task_runs = self._unrecorded
        self._unrecorded = None
        if flow_run_id is not None:
            wait_until_recorded(flow_run_id, task_runs)

    def call(self, method: Any, *args: Any, returns: int = 1) -> Any:
        if returns == 1:
            return method.remote(*args)
        return method.options(num_returns=returns).remote(*args)

    def stage(self, stage_task: Any, iteration: int, *args: Any) -> Any:
        started = time.perf_counter()
        with self._bounded(), naming_failures(stage_task.name, iteration, self.explain):
            if self.prefect_tasks:
                self.task_runs += 1
                result = stage_task(iteration, *args, wait_for=list(self._upstream) or None)
            else:
                result = stage_task.fn(iteration, *args)
        self.seconds[stage_task.name] = time.perf_counter() - started
        self._upstream = [result]
        return result

    def concurrent_stages(self, label: str, iteration: int, *stages: tuple[Any, tuple[Any, ...]]) -> list[Any]:
        """Stages that run side by side (the two trainers), each its own task run."""
        started = time.perf_counter()
        results = []
        with self._bounded():
            if self.prefect_tasks:
                upstream = list(self._upstream) or None
                self.task_runs += len(stages)
                futures = [(task, task.submit(iteration, *args, wait_for=upstream)) for task, args in stages]
                self._upstream = [future for _, future in futures]
                waits = [(task, future.result) for task, future in futures]
            else:
                waits = [(task, partial(task.fn, iteration, *args)) for task, args in stages]
            for task, wait in waits:
                with naming_failures(task.name, iteration, self.explain):
                    results.append(wait())
        self.seconds[label] = time.perf_counter() - started
        return results

    def get(self, pending: Any) -> Any:
        import ray

        return ray.get(pending, timeout=self.stage_timeout_s)

    @contextmanager
    def _bounded(self) -> Iterator[None]:
        """Every wait inside a stage's task, submitted ones included (Prefect copies
        the context into its threads), is bounded by the stage timeout."""
        from tasks.stages import stage_timeout

        token = stage_timeout.set(self.stage_timeout_s)
        try:
            yield
        finally:
            stage_timeout.reset(token)

    def explain(self, error: BaseException) -> str | None:
        """A dead or stuck actor named by its role (and node), instead of Ray's actor id."""
        from ray.exceptions import RayActorError, RayError

        from processes.actors import kill_quietly
        from tasks.stages import StageTimeout

        if isinstance(error, StageTimeout):
            # The first outstanding call is the stuck one; later calls of the stage may
            # only be waiting for its output.
            stuck = error.late[0].task_id().actor_id().hex()
            name, handle = self._actors.get(stuck, (f"actor {stuck}", None))
            if handle is not None:
                kill_quietly(handle)
            node = self._nodes.get(stuck)
            where = f"; it ran on {node_name(node, node_addresses())}" if node and len(self.layout()) > 1 else ""
            return (
                f"no result from the {name} actor within {error.seconds:g} s "
                f"(rl.stage_timeout_seconds={error.seconds:g}); killed it so it holds no device{where}"
            )
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if isinstance(error, RayActorError):
            name = self._actors.get(error.actor_id or "", (f"actor {error.actor_id}", None))[0]
            node = self._nodes.get(error.actor_id or "")
            if node is None:
                address = re.search(r"\bip: ([0-9a-fA-F.:]+)", str(error))
                where = f" on node {address.group(1)}" if address else ""
                return f"the {name} actor{where} is gone: {first_line}"
            addresses = node_addresses()
            lost = f": {self._lost(node, addresses)}" if is_lost(node, addresses) else ""
            return f"the {name} actor on {node_name(node, addresses)} is gone{lost}: {first_line}"
        if isinstance(error, RayError) and self._nodes:
            # An input held on a lost node (ObjectLostError and kin) names no actor:
            # name the node and what ran there.
            addresses = node_addresses()
            lost = [self._lost(node, addresses) for node in self.layout() if is_lost(node, addresses)]
            if lost:
                return f"{'; '.join(lost)}: {first_line}"
        return None

    def _lost(self, node: str, addresses: dict[str, tuple[str, bool]]) -> str:
        return f"{node_name(node, addresses)} left the Ray cluster (it held {', '.join(self.layout()[node])})"


def labelled_actors(roles: Any) -> dict[str, Any]:
    """Every rank's handle under the role name a user reads (`policy`, `policy[1]`)."""
    from processes.actors import actor_label

    labelled: dict[str, Any] = {}
    for role, _ in roles.items():
        ranks = roles.ranks(role)
        for rank, handle in enumerate(ranks):
            labelled[actor_label(role, rank, len(ranks))] = handle
    return labelled


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

    def block(self, first: int, last: int, body: Callable[[], Result], last_block: bool = False) -> Result:
        """No UI to group iterations for: the block's iterations, as they come."""
        return body()

    def wait_recorded(self) -> None:
        """Nothing is recorded anywhere."""

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
