"""The loop over one run's iterations: block by block (each block a subflow run in the
Prefect UI), every finished row handed on at once, and a stop request asked at every
iteration end, so a stopped run commits the iteration it finished (S-STOP-1, S-STOP-4).
One iteration itself is flows/iteration.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from checkpoint.boundary import CommittedBoundary
from checkpoint.role_layout import REWARD_DIR
from configs.schema import PPOConfig
from contracts.stage_names import time_key
from flows.blocks import iteration_blocks
from flows.iteration import (
    Batch,
    Runner,
    evaluate,
    evaluates_at,
    held_batch,
    ppo_iteration,
    save_on_cadence,
)
from flows.stopping import StopRequest, Stopped
from algorithm.update_plan import SHAPE_NAMES, UpdatePlan, held_shape
from algorithm.warmup import expected_policy_version
from contracts.experience import remove_experience_after
from rundir.resume import (
    ResumeError,
    ResumePoint,
    go_back,
    restore_boundary_row,
    resume_logger,
    start_from_scratch,
    truncate_metrics,
)
from weights.transport import deliver
from rundir.reward_model_identity import keeps_reward_state
from rundir.run_outputs import RunPaths

if TYPE_CHECKING:
    from flows.iteration import Roles

@dataclass
class IterationLoop:
    """What every iteration of one run shares: the runner, the roles, the config, the
    run's folders (None writes nothing) and who receives each finished metrics row.
    The flow runs each block as a subflow run (flows/flow_runner.py FlowIterationLoop)."""

    run: Runner
    roles: Roles
    config: PPOConfig
    paths: RunPaths | None = None
    on_record: Callable[[dict[str, Any]], None] | None = None
    in_flight: Batch | None = None  # one step off: the next iteration's batch (S-ASYNC-3)
    stop: StopRequest | None = None  # asked at every iteration end (S-STOP)
    on_block_end: Callable[[], None] | None = None  # inside a block's subflow run, as it ends (S-FOOT-1)

    @property
    def stopped(self) -> Stopped | None:
        """How the run stopped before its last iteration, if it did."""
        return None if self.stop is None else self.stop.outcome

    def run_iterations(self, start: int, last: int, policy_version: int) -> tuple[int, CommittedBoundary | None]:
        """Iterations `start..last`, block by block; each record goes to `on_record` as
        soon as it is complete. Returns the policy_version reached and the last
        boundary committed."""
        last_commit = None
        if start == 1 and evaluates_at(self.config, 0):
            # The starting policy's row, iteration 0: every later evaluation compares with it.
            self.run.start_iteration()
            record = {"iteration": 0, **evaluate(self.run, self.roles, 0, policy_version)}
            record |= {time_key(stage): seconds for stage, seconds in self.run.seconds.items()}
            self._emit(record)
        for first, block_last in iteration_blocks(start, last, self.config.job.iterations_per_block):
            if first > start and self.stop is not None and self.stop.due() is not None:
                # A stop that came while the previous block closed: no iteration is in
                # progress, so the one that finished is committed now, not after another.
                return policy_version, self._stop_after(first - 1, policy_version) or last_commit
            policy_version, committed = self.block(first, block_last, policy_version)
            last_commit = committed or last_commit
            if self.stopped is not None:
                break
        return policy_version, last_commit

    def block(self, first: int, last: int, policy_version: int) -> tuple[int, CommittedBoundary | None]:
        """The iterations `first..last` of one block; as `run_iterations` returns."""
        last_commit = None
        for iteration in range(first, last + 1):
            started = time.perf_counter()
            if self.stop is not None:
                self.stop.progress.doing, self.stop.progress.iteration = f"iteration {iteration}", iteration
            result = ppo_iteration(
                self.run, self.roles, self.config, iteration, policy_version, self.paths, self.in_flight,
                identity=self.identity,
            )
            result.record["time/iteration_seconds"] = time.perf_counter() - started
            policy_version, last_commit = result.policy_version, result.committed or last_commit
            if self.stop is not None and result.committed is not None:
                self.stop.progress.kept(iteration, result.committed.path)
            self.in_flight = result.ahead
            self._finished = result
            self._emit(result.record)
            if self.stop is not None and self.stop.due() is not None:
                return policy_version, self._stop_after(iteration, policy_version) or last_commit
        return policy_version, last_commit

    # The last IterationResult this loop ran, and the run's identity as read at launch
    # (rundir/run_identity.py), which every commit records: not dataclass fields, so that
    # Prefect, which rebuilds a flow's dataclass parameters field by field, leaves them alone.
    _finished = None
    identity = None

    def _stop_after(self, iteration: int, policy_version: int) -> CommittedBoundary | None:
        """S-STOP-1: the finished iteration is committed as a full boundary, once; the
        last one too, and the run then stops before its export (S-STOP-4)."""
        assert self.stop is not None and self._finished is not None
        committed = self._finished.committed or save_on_cadence(
            self.run, self.roles, self.config, iteration, policy_version, self.paths, self._finished.record,
            self._finished.ahead, kind="full", identity=self.identity,
        )
        if committed is not None:
            self.stop.progress.kept(iteration, committed.path)
        self.stop.stopped_at(iteration, committed.path if committed else None)
        return committed

    def _emit(self, record: dict[str, Any]) -> None:
        if self.on_record is not None:
            self.on_record(record)


# --- set-up shared by the flow (flows/training.py) and the in-process runner ----------


def open_run_dir(paths: RunPaths, point: ResumePoint | None) -> None:
    """The run's folders, and a fresh start's leftovers of an older run set aside."""
    paths.ensure()
    if point is None:
        start_from_scratch(paths)


@dataclass
class Resumed:
    start: int  # the first iteration to run
    policy_version: int | None  # the restored clock; None on a fresh start
    in_flight: Batch | None  # one step off: the batch the boundary holds (S-ASYNC-3)


def resume_roles(run: Runner, roles: Roles, config: PPOConfig, paths: RunPaths, point: ResumePoint | None) -> Resumed:
    """Every role restored from `point` and its in-flight batch taken back, or a fresh
    start at iteration 1: the same for both runners, so both resume alike (S-CKPT-8)."""
    if point is None:
        return Resumed(1, None, None)
    policy_version = restore_roles(run, roles, point, config, paths)
    return Resumed(point.iteration + 1, policy_version, held_batch(run, roles, point.boundary, point.iteration))


def restore_roles(run: Runner, roles: Roles, point: ResumePoint, config: PPOConfig, paths: RunPaths) -> int:
    """Load every role from the boundary into the (possibly fresh) actors or role
    objects, verify the counters the marker
    vouches for, and hand the rollout the restored weights. Returns the restored
    policy_version."""
    boundary = point.boundary
    # Every rank of a data-parallel trainer loads the boundary, resharded to this
    # run's rank count (S-SCALE-2); all loads are submitted before any is awaited
    # (a sharded load is a collective).
    policy_loads = [run.call(rank.load, f"{boundary}/policy") for rank in roles.policy_ranks()]
    critic_loads = [run.call(rank.load, f"{boundary}/critic") for rank in roles.critic_ranks()]
    reward_load = [run.call(roles.reward.load, f"{boundary}/{REWARD_DIR}")] if keeps_reward_state(config) else []
    states = run.get([*policy_loads, *critic_loads, run.call(roles.data.load, f"{boundary}/data"), *reward_load])
    policy_state = states[0]
    trainer_states = {"policy": policy_state}
    if critic_loads:  # a critic-free run has none (S-OPT-2)
        trainer_states["critic"] = states[len(policy_loads)]
    observed = {role: int(state["optimizer_step"]) for role, state in trainer_states.items()}
    recorded = point.marker.get("role_steps")
    if recorded is None:
        # S-CKPT-3: an older marker without role_steps: all roles must agree.
        resume_logger().warning(f"{boundary}/_SUCCESS has no role_steps; checking that all roles agree instead")
        if len(set(observed.values())) != 1:
            raise ResumeError(f"{boundary}: roles disagree on optimizer steps {observed} and the marker records none")
    else:
        for role, steps in observed.items():
            if int(recorded.get(role, -1)) != steps:
                raise ResumeError(
                    f"{boundary}: {role} restored at optimizer step {steps}, the marker recorded {recorded.get(role)}"
                )
    configured_shape = UpdatePlan.from_config(config.rl, config.job.seed, point.iteration + 1).shape
    for role, state in trainer_states.items():
        saved_shape = state.get("plan_shape")
        if saved_shape is not None and held_shape(saved_shape) != configured_shape:  # S-FLOW-4, S-PATH-2
            raise ResumeError(
                f"{boundary}: {role} was trained with update plan {SHAPE_NAMES} = "
                f"{held_shape(saved_shape)}, this run is configured with {configured_shape}"
            )
    policy_version = int(policy_state["policy_version"])
    expected = expected_policy_version(point.iteration, config.rl.critic_warmup_iterations)
    if policy_version != expected:
        raise ResumeError(
            f"{boundary}: restored policy_version {policy_version} but iteration {point.iteration} with "
            f"{config.rl.critic_warmup_iterations} warmup iterations implies {expected}"
        )
    # Every policy rank gathers (a collective on sharded ranks); rank 0's are the weights.
    weights, version = [run.call(rank.current_weights, returns=2) for rank in roles.policy_ranks()][0]
    run.get(deliver(weights, version, roles.engines(), run.call))
    if point.went_back:
        go_back(paths, point.iteration)
    else:
        truncate_metrics(paths.metrics, point.iteration)
        remove_experience_after(paths.experience, point.iteration)  # S-OPS-3: those iterations run again
    restore_boundary_row(paths.metrics, boundary, point.iteration)
    resume_logger().info(f"resumed from {boundary} (iteration {point.iteration}, policy_version {policy_version})")
    return policy_version
