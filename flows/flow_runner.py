"""The flow's way of running the iteration program (flows/iteration.py): every role call
goes to its Ray actor at once (Ray runs one actor's calls in submission order, and a call
whose argument failed does not run), every stage is awaited by its Prefect task, so the
UI shows one task run per stage, and each block of iterations is a subflow run.

A failure is named the same way as in process (flows/failures.py); a stage's
`time/<stage>_seconds` is its task's wall time.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import ray
from prefect import flow
from prefect.states import Cancelled
from prefect.utilities.annotations import quote
from ray.exceptions import RayActorError, RayError

from flows.blocks import BLOCK_FLOW, block_name
from flows.failures import naming_failures, stage_run_name
from flows.iteration_loop import IterationLoop
from flows.stopping import stop_signals
from flows.recording import PrefectDatabaseFull, compact_recorded, database_space_problem, wait_until_recorded
from placement.nodes import actor_whereabouts, is_lost, node_addresses, node_name
from processes.actors import RoleHandles, actor_label
from processes.dead_actors import first_line, kill_quietly
from tasks.prefect_tasks import TASKS, StageTimeout, samples_key, stage_timeout
from views.run_artifacts import artifacts_on_this_run, current_flow_run_id


POOL_LABEL = "rollout pool"  # how messages name the engine pool's actor
ENGINE_ANSWER_S = 10.0  # the pool answers `stuck` at once, even on a busy machine (a worker starts to ask it)


class FlowRunner:
    """Role calls on Ray actors, stages as Prefect tasks of the running flow.

    Given the run's actor handles, a failure names the role whose actor died or hung,
    and a stage that waits longer than `stage_timeout_s` fails and kills the actors it
    was waiting for, so nothing stuck keeps holding a device (S-FAULT-1)."""

    def __init__(
        self, roles: RoleHandles | None = None, *, stage_timeout_s: float | None = None, samples_key: str | None = None
    ) -> None:
        self.stage_timeout_s = stage_timeout_s
        self.samples_key = samples_key  # where train_critic's task shows a few samples
        self.seconds: dict[str, float] = {}
        self.task_runs = 0  # stage task runs started in the current block
        self._unrecorded: tuple[Any, int] | None = None  # the last block's (flow run, task runs) to wait for
        self._upstream: list[Any] = []  # the previous stage's result: an arrow in the UI's graph
        self._inputs: dict[Any, list[Any]] = {}  # a call's result -> the calls it takes as arguments
        self.running: dict[str, None] = {}  # the stage task runs in flight, as the UI names them
        labelled = labelled_actors(roles) if roles is not None else {}
        where = actor_whereabouts(labelled) if labelled else {}
        # Ray actor id -> (the role as a user reads it, handle), and -> the node it runs on
        self._actors = {actor_id: (label, labelled[label]) for label, (actor_id, _) in where.items()}
        self._nodes = {actor_id: node for actor_id, node in where.values()}
        # The engine pool's actor id: a stage stuck on the pool is stuck on the engine it names.
        self._pool = where.get(POOL_LABEL, (None, None))[0]
        self._engine_count = len(roles.ranks("rollout")) if roles is not None and roles.pool is not None else 0

    def layout(self) -> dict[str, list[str]]:
        """Node id -> the actors on it (role and rank), as found at start-up."""
        layout: dict[str, list[str]] = {}
        for key, node in self._nodes.items():
            layout.setdefault(node, []).append(self._actors[key][0])
        return layout

    def start_iteration(self) -> None:
        self.seconds = {}
        self._upstream = []
        # Only this iteration's calls: every stage that waits for them (one step off, the
        # next batch's rollout too) ends inside it, and the references are let go here.
        self._inputs = {}

    def _waits_for(self, ref: Any) -> list[Any]:
        return self._inputs.get(ref, [])

    def stuck_call(self, late: Any) -> Any:
        """The call that holds `late` up: `late` itself, unless an input it waits for
        has not finished either (engine 0's gather waits for every engine's shard, so a
        hung engine k is found behind it, not engine 0)."""
        seen = {late}
        while True:
            pending = [ref for ref in self._waits_for(late) if ref not in seen]
            if not pending:
                return late
            unfinished = [ref for ref in pending if not ray.wait([ref], timeout=0)[0]]
            if not unfinished:
                return late
            late = unfinished[0]
            seen.add(late)

    def _pool_waits_on(self) -> tuple[str, Any, str] | None:
        """The engine the pool's generate waits on longest, as the pool itself answers
        (processes/engine_pool.py `stuck`): (its label, handle, node), or None."""
        from processes.engine_pool import ask_stuck

        pool = self._actors[self._pool][1]
        try:
            answer = ray.get(ask_stuck.remote(pool), timeout=ENGINE_ANSWER_S)
        except Exception:  # noqa: BLE001  (a pool that does not answer is the stuck actor itself)
            return None
        if answer is None:
            return None
        rank, handle, node = answer
        return actor_label("rollout", rank, self._engine_count), handle, node

    def block_ran(self, last_block: bool) -> None:
        """Called at the end of a block's subflow run: wait until the server has recorded
        every task run the block ran (flows/recording.py), so none is lost. The run's last
        block leaves that wait to `wait_recorded`, which the flow calls once its closing
        work (export, summary) is done, instead of adding it to every run's end."""
        if last_block:
            self._unrecorded = (current_flow_run_id(), self.task_runs)
        else:
            self._recorded(current_flow_run_id(), self.task_runs)
        self.task_runs = 0

    def _recorded(self, flow_run_id: Any, task_runs: int) -> None:
        """Waits until the block's task runs are recorded, then compacts their history
        (compat/prefect_history.py): only once every state is in can none come after."""
        wait_until_recorded(flow_run_id, task_runs)
        compact_recorded(flow_run_id)

    def wait_recorded(self) -> None:
        """The last block's wait (see `block`), once; nothing when there is none."""
        if self._unrecorded is None:
            return
        flow_run_id, task_runs = self._unrecorded
        self._unrecorded = None
        if flow_run_id is not None:
            self._recorded(flow_run_id, task_runs)

    def call(self, method: Any, *args: Any, returns: int = 1) -> Any:
        result = method.remote(*args) if returns == 1 else method.options(num_returns=returns).remote(*args)
        inputs = [arg for arg in args if isinstance(arg, ray.ObjectRef)]
        if inputs:  # what the call waits for before it can run: how a timeout finds the stuck call
            for ref in result if returns > 1 else [result]:
                self._inputs[ref] = inputs
        return result

    def stage(self, body: Callable[..., Any], iteration: int, *args: Any, waits: Sequence[Any] = ()) -> Any:
        started = time.perf_counter()
        with self._bounded(), self._in_flight(body, iteration), naming_failures(body.__name__, iteration, self.explain):
            self.task_runs += 1
            result = self._run(body, iteration, args, list(self._upstream) or None, waits)
        self.seconds[body.__name__] = time.perf_counter() - started
        self._upstream = [result]
        return result

    def concurrent_stages(
        self, label: str, iteration: int, *stages: tuple[Callable[..., Any], tuple[Any, ...]]
    ) -> list[Any]:
        """Stages that run side by side (the two trainers), each its own task run."""
        started = time.perf_counter()
        results = []
        with self._bounded():
            upstream = list(self._upstream) or None
            self.task_runs += len(stages)
            futures = [(body, self._submit(body, iteration, args, upstream)) for body, args in stages]
            self._upstream = [future for _, future in futures]
            names = [stage_run_name(body.__name__, iteration) for body, _ in futures]
            self.running.update(dict.fromkeys(names))  # both run side by side from now on
            try:
                for (body, future), name in zip(futures, names):
                    with naming_failures(body.__name__, iteration, self.explain):
                        results.append(future.result())
                    self.running.pop(name, None)
            finally:  # a failed stage ends the iteration: none of the pair is left listed
                for name in names:
                    self.running.pop(name, None)
        self.seconds[label] = time.perf_counter() - started
        return results

    def start_stage(self, body: Callable[..., Any], iteration: int, *args: Any) -> Any:
        """A stage's task run started now, beside the stages that follow it (one step
        off: the next iteration's rollout); `finish_stage` waits for it."""
        with self._bounded():
            self.task_runs += 1
            self.running[stage_run_name(body.__name__, iteration)] = None
            return (body, iteration, time.perf_counter(), self._submit(body, iteration, args, None))

    def finish_stage(self, started: Any) -> tuple[Any, float]:
        """The started stage's result and its seconds from start to end."""
        body, iteration, began, future = started
        with self._bounded(), self._in_flight(body, iteration), naming_failures(body.__name__, iteration, self.explain):
            result = future.result()
        return result, time.perf_counter() - began

    @contextmanager
    def _in_flight(self, body: Callable[..., Any], iteration: int) -> Iterator[None]:
        """The stage counts as running until its result is in (a stop past its grace names it)."""
        label = stage_run_name(body.__name__, iteration)
        self.running[label] = None
        try:
            yield
        finally:
            self.running.pop(label, None)

    def _run(
        self, body: Callable[..., Any], iteration: int, args: tuple[Any, ...], upstream: Any, waits: Sequence[Any]
    ) -> Any:
        """The stage's task run, waited for. Its arguments are quoted: Prefect would walk
        every list and object in them for futures (there are none; the graph's arrows are
        `wait_for`), a cost per task run that grows with the batch."""
        return TASKS[body](iteration, quote(args), quote(waits), wait_for=upstream)

    def _submit(self, body: Callable[..., Any], iteration: int, args: tuple[Any, ...], upstream: Any) -> Any:
        """The stage's task run, started; its `.result()` waits for it."""
        return TASKS[body].submit(iteration, quote(args), wait_for=upstream)

    def get(self, pending: Any) -> Any:
        return ray.get(pending, timeout=self.stage_timeout_s)

    @contextmanager
    def _bounded(self) -> Iterator[None]:
        """Every wait inside a stage's task, submitted ones included (Prefect copies
        the context into its threads), is bounded by the stage timeout."""
        token = stage_timeout.set(self.stage_timeout_s)
        key = samples_key.set(self.samples_key)
        try:
            yield
        finally:
            samples_key.reset(key)
            stage_timeout.reset(token)

    def explain(self, error: BaseException) -> str | None:
        """A dead or stuck actor named by its role (and node), instead of Ray's actor id."""
        if isinstance(error, StageTimeout):
            # The first outstanding call is the stuck one; later calls of the stage may
            # only be waiting for its output.
            stuck = self.stuck_call(error.late[0]).task_id().actor_id().hex()
            name, handle = self._actors.get(stuck, (f"actor {stuck}", None))
            node = self._nodes.get(stuck)
            where = f"; it ran on {node_name(node, node_addresses())}" if node and len(self.layout()) > 1 else ""
            waited_on = self._pool_waits_on() if stuck == self._pool else None
            if waited_on is not None:  # the pool waits for an engine: that engine is the stuck one
                name, handle, engine_node = waited_on
                where = f"; it ran on {engine_node}" if len(self.layout()) > 1 else ""
            if handle is not None:
                kill_quietly(handle)
            return (
                f"no result from the {name} actor within {error.seconds:g} s "
                f"(rl.stage_timeout_seconds={error.seconds:g}); killed it so it holds no device{where}"
            )
        if isinstance(error, RayActorError):
            name = self._actors.get(error.actor_id or "", (f"actor {error.actor_id}", None))[0]
            node = self._nodes.get(error.actor_id or "")
            if node is None:
                address = re.search(r"\bip: ([0-9a-fA-F.:]+)", str(error))
                where = f" on node {address.group(1)}" if address else ""
                return f"the {name} actor{where} is gone: {first_line(error)}"
            addresses = node_addresses()
            lost = f": {self._lost(node, addresses)}" if is_lost(node, addresses) else ""
            return f"the {name} actor on {node_name(node, addresses)} is gone{lost}: {first_line(error)}"
        if isinstance(error, RayError) and self._nodes:
            # An input held on a lost node (ObjectLostError and kin) names no actor:
            # name the node and what ran there.
            addresses = node_addresses()
            lost = [self._lost(node, addresses) for node in self.layout() if is_lost(node, addresses)]
            if lost:
                return f"{'; '.join(lost)}: {first_line(error)}"
        return None

    def _lost(self, node: str, addresses: dict[str, tuple[str, bool]]) -> str:
        return f"{node_name(node, addresses)} left the Ray cluster (it held {', '.join(self.layout()[node])})"


def labelled_actors(roles: Any) -> dict[str, Any]:
    """Every rank's handle under the role name a user reads (`policy`, `policy[1]`)."""
    labelled: dict[str, Any] = {}
    for role, _ in roles.items():
        ranks = roles.ranks(role)
        for rank, handle in enumerate(ranks):
            labelled[actor_label(role, rank, len(ranks))] = handle
    if roles.pool is not None:
        labelled[POOL_LABEL] = roles.pool
    return labelled


def _block_run_name() -> str:
    from prefect.runtime import flow_run

    return block_name(int(flow_run.parameters["first"]), int(flow_run.parameters["last"]))


class FlowIterationLoop(IterationLoop):
    """The iteration loop of a flow run: each block of iterations is a subflow run of the
    `ppo` flow run (S-OPS-1), whose parameters are the block's first and last iteration
    and the policy version it starts from."""

    run: FlowRunner

    def run_iterations(self, start: int, last: int, policy_version: int) -> tuple[int, Any]:
        with artifacts_on_this_run():  # a block's tables and samples show on the `ppo` flow run
            return super().run_iterations(start, last, policy_version)

    def block(self, first: int, last: int, policy_version: int) -> tuple[int, Any]:
        from prefect.exceptions import CancelledRun

        problem = database_space_problem()
        if problem is not None:
            raise PrefectDatabaseFull(problem)
        try:
            return self.block_flow(first, last, policy_version)
        except CancelledRun:
            if self._stopped_block is None:  # cancelled by something else than the run's stop
                raise
            return self._stopped_block

    _stopped_block: tuple[int, Any] | None = None  # what a stopped block reached (its run ends Cancelled)

    @flow(
        name=BLOCK_FLOW, flow_run_name=_block_run_name, validate_parameters=False, persist_result=False,
        log_prints=False,
    )
    def block_flow(self, first: int, last: int, policy_version: int) -> Any:
        """Iterations `first..last` as one child flow run. A failure inside fails the
        block's run and reaches the caller as the very exception the iteration raised.
        A stop ends it Cancelled, renamed after the iterations it ran: the UI must not
        show a green `iterations 1-30` that ran 1-9 (the UI shows this docstring)."""
        self.run.task_runs = 0  # the count of this block's task runs only (the parent's evaluate[iter=0] is not)
        with stop_signals(self.stop, in_a_flow=True):  # over the handler Prefect's engine installed for this block
            try:
                reached = IterationLoop.block(self, first, last, policy_version)
            finally:  # finished, stopped or failed: the block's table goes out once, on its own run
                if self.on_block_end is not None:
                    self.on_block_end()
            stopped = self.stopped
            self.run.block_ran(last_block=last == self.config.rl.max_steps or stopped is not None)
            if stopped is None:
                return reached
            self._stopped_block = reached  # S-STOP-4: the block says what ran, and that the run stopped
            ran = block_name(first, stopped.iteration) + " (stopped)"
            rename_this_flow_run(ran)
        return Cancelled(message=f"ran {block_name(first, stopped.iteration)} of {block_name(first, last)}: the run "
                                 f"stopped ({stopped.reason}) after iteration {stopped.iteration}")


def rename_this_flow_run(name: str) -> None:
    """The running flow run's name in the UI, changed now."""
    from prefect.client.orchestration import get_client

    flow_run_id = current_flow_run_id()
    if flow_run_id is not None:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run_id, name=name)
