"""The rollout engines of a run with several of them, behind one actor that owns every
call to them (S-ELASTIC-1..3): the iteration program asks the pool for a batch, a
weight load or an evaluation, and the pool hands shard `i` of `N` to engine `i` and has
a live engine merge the shards.

`rl.rollout.max_engine_replacements` bounds how many engines a run may replace. An
engine whose process dies, or that does not answer within
`rl.rollout.engine_timeout_seconds`, is killed; within the bound its shard is generated
again on a surviving engine with the same shard index, hence the same seed, and the
same policy version, and a new engine is started on the lost one's placement and given
the current weights through the configured transport (`weights.transport.deliver` over
the one new receiver). Past the bound the stage fails naming the engine; with a bound of
0 an engine's failure is its own, passed on for the flow's runner to name as any role's
(S-FAULT-1). The N logical shards never change: re-splitting the rows would change
every row's random stream.

The pool's calls run one at a time, in the order the flow queued them, so a
regenerated shard is finished before the next version's `load_weights` reaches any
engine: a shard is always generated with the version it was asked for. The pool keeps
the current publication, so its buckets stay alive until every engine, a replacement
included, holds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from configs.schema import PPOConfig
from contracts.generated_rows import check_generated
from contracts.rollout_faults import (
    FAULT_EVENTS, LOST_KEY, REPLACE_SECONDS_KEY, EngineLost, EngineReplaced, Regeneration, as_event,
)
from contracts.timeouts import startup_timeout
from contracts.trajectory import PromptBatch, Trajectory
from placement.nodes import actor_whereabouts, node_addresses, node_name
from processes.dead_actors import first_line, kill_quietly
from weights.nixl_transport import WeightTransferError
from weights.publication import WeightPublication
from weights.transport import deliver


WATCH_GROUP = "watch"
"""The pool's second concurrency group: `stuck` answers while a generate runs in the
default group, whose calls still run one at a time, in order."""


class RolloutEngineLost(RuntimeError):
    """More rollout engines were lost than the run may replace, or every one of them."""


@dataclass(frozen=True)
class EngineLaunch:
    """How engine `rank` was started, so that its replacement starts the same way: the
    role's class and constructor arguments, and the actor options (its placement bundle)."""

    rank: int
    role: type
    args: tuple[Any, ...]
    options: dict[str, Any]
    namespace: str


@dataclass
class Engine:
    rank: int
    handle: Any
    node: str = "an unknown node"  # as users read it
    outstanding: int = 0  # calls queued on it and not yet answered
    lost: bool = False
    loss: EngineLost | None = None  # the record of its last loss, which its regenerated shards join
    # A replacement that could not read the current version (over NIXL the policy may
    # have staged the next one meanwhile): it serves no shard until the next load.
    behind: bool = False


@dataclass
class ShardCall:
    shard: int
    engine: Engine
    trajectory: Any  # ObjectRef
    summary: Any  # ObjectRef
    deadline: float
    submitted: float
    regeneration: Regeneration | None = None  # a lost shard generated again: its entry in the loss's record


@dataclass
class Replacement:
    lost: Engine
    handle: Any
    started: float  # wall clock (time.time), comparable with the engine's own `built_at`


@dataclass
class Faults:
    """What one pool call survived, reported with the batch it generated."""

    lost: int = 0
    replace_seconds: float = 0.0
    events: list[EngineLost | EngineReplaced] = field(default_factory=list)

    def summary(self, counted: bool) -> dict[str, Any]:
        """The events, and the two metrics where `counted` (a run that may replace engines)."""
        metrics = {LOST_KEY: float(self.lost), REPLACE_SECONDS_KEY: self.replace_seconds} if counted else {}
        return {**metrics, FAULT_EVENTS: [as_event(event) for event in self.events]}


@dataclass
class GenerateRound:
    """One `generate` call as a value: the batch's shard calls in flight, the shards
    done, and what the round survived."""

    prompts: Any  # ObjectRef of the PromptBatch
    required_version: int
    count: int  # the N logical shards
    timeout_s: float | None
    faults: Faults
    calls: dict[Any, ShardCall] = field(default_factory=dict)  # by its summary's ObjectRef
    done: dict[int, ShardCall] = field(default_factory=dict)  # by shard

    def submit(self, index: int, engine: Engine, regeneration: Regeneration | None = None) -> None:
        trajectory, summary = engine.handle.generate.options(num_returns=2).remote(
            self.prompts, self.required_version, index, self.count
        )
        engine.outstanding += 1
        now = time.monotonic()
        deadline = float("inf") if self.timeout_s is None else now + self.timeout_s * engine.outstanding
        self.calls[summary] = ShardCall(index, engine, trajectory, summary, deadline, now, regeneration)

    def wait_s(self) -> float | None:
        """How long the next wait may last before a call is overdue (None: no deadline)."""
        due = min(call.deadline for call in self.calls.values()) - time.monotonic()
        return None if due == float("inf") else max(0.0, due)

    def answered(self, ref: Any) -> ShardCall:
        call = self.calls.pop(ref)
        call.engine.outstanding -= 1
        return call

    def finished(self, call: ShardCall) -> None:
        self.done[call.shard] = call
        if call.regeneration is not None:
            call.regeneration.done_after_s = time.monotonic() - call.submitted

    def overdue(self) -> list[ShardCall]:
        now = time.monotonic()
        return [call for call in self.calls.values() if call.deadline <= now]

    def take_back(self, engine: Engine) -> list[ShardCall]:
        """Every call still queued on a lost engine, out of the round."""
        moved = [call for call in self.calls.values() if call.engine is engine]
        for call in moved:
            self.calls.pop(call.summary)
        engine.outstanding = 0
        return moved

    def oldest(self) -> ShardCall | None:
        """The unanswered call submitted first: what the round waits on longest."""
        waiting = list(self.calls.values())
        return min(waiting, key=lambda call: call.submitted) if waiting else None


def engine_deadline(config: PPOConfig) -> float | None:
    """Seconds an engine call may take before the engine counts as lost: the key, or a
    quarter of the stage timeout, so a hung engine is replaced long before its stage
    fails. None when no engine may be replaced: the stage timeout then bounds the wait,
    as for every role, and names the hung engine (flows/flow_runner.py)."""
    rollout, stage = config.rl.rollout, config.rl.stage_timeout_seconds
    if not rollout.max_engine_replacements:
        return None
    return rollout.engine_timeout_seconds or (None if stage is None else stage / 4)


def elastic(config: PPOConfig, engines: int) -> bool:
    """Whether a run survives a lost engine: several engines and replacements allowed.
    Only such a run reports the fault metrics."""
    return engines > 1 and config.rl.rollout.max_engine_replacements > 0


class EnginePool:
    """Every rollout engine of a run with several, and the verbs the iteration program
    calls on them: `generate`, `load_weights`, `evaluate`."""

    def __init__(self, config: PPOConfig, engines: list[Any], launches: list[EngineLaunch]):
        self.timeout_s = engine_deadline(config)
        self.max_replacements = config.rl.rollout.max_engine_replacements
        self.counted = elastic(config, len(engines))
        self.ready_timeout_s = startup_timeout(config.rl.stage_timeout_seconds)
        self.launches = launches
        self.engines = [Engine(rank, handle) for rank, handle in enumerate(engines)]
        self.replaced = 0  # engines replaced in this run (this pool's life)
        self.published: tuple[WeightPublication, int] | None = None
        self.pending: list[Replacement] = []
        self.carried = Faults()  # losses met outside a generate, reported with the next batch
        self.round: GenerateRound | None = None  # the generate in progress, for `stuck`

    def ready(self) -> dict[str, Any]:
        """Called once the engines are ready: where each runs, for the messages."""
        self._locate(self.engines)
        return {"role": "rollout pool", "engines": len(self.engines)}

    def generate(self, prompts: PromptBatch, required_version: int) -> tuple[Trajectory, dict[str, Any]]:
        """The whole batch, one shard per engine, each lost shard generated again on a
        survivor; then checked row by row before anything trains on it."""
        self._finish_replacements(self.carried)  # started after an earlier loss: waited for now, not then
        faults, self.carried = self.carried, Faults()
        batch = GenerateRound(ray.put(prompts), required_version, len(self.engines), self.timeout_s, faults)
        self.round = batch
        for engine in self.engines:  # shard i on engine i; a lost or lagging one's on a survivor
            batch.submit(engine.rank, engine if self._serves(engine) else self._least_busy())
        while batch.calls:
            ready, _ = ray.wait(list(batch.calls), num_returns=1, timeout=batch.wait_s())
            if ready:
                call = batch.answered(ready[0])
                try:
                    ray.get(call.summary)
                except RayActorError as error:
                    self._regenerate(batch, call, error, prompts.iteration)
                    continue
                batch.finished(call)
                continue
            for call in batch.overdue():
                if call.summary in batch.calls:  # not moved with an engine lost in this same pass
                    batch.answered(call.summary)
                    self._regenerate(batch, call, GetTimeoutError(), prompts.iteration)
        self.round = None
        trajectory, summary = self._gather([batch.done[index] for index in range(batch.count)], faults)
        check_generated(trajectory, prompts.row_ids)  # S-ELASTIC-3: never train on a failed generation
        return trajectory, {**summary, **faults.summary(self.counted)}

    @ray.method(concurrency_group=WATCH_GROUP)
    def stuck(self) -> tuple[int, Any, str] | None:
        """The engine a generate in progress waits on longest, as (rank, handle, node), or
        None. It runs in its own concurrency group, beside the generate; ask it from
        another caller than the one that queued the run's calls (`ask_stuck`): Ray sends
        one caller's calls to an actor in order, so behind a queued call whose inputs wait
        on the hung generate it would never be sent."""
        batch = self.round
        oldest = batch.oldest() if batch is not None else None
        return None if oldest is None else (oldest.engine.rank, oldest.engine.handle, oldest.engine.node)

    def load_weights(self, published: WeightPublication, policy_version: int) -> dict[str, float]:
        """Every engine takes the version: a replacement started since the last call as
        soon as it is ready, the others at once; one lost meanwhile is replaced at the
        next call. The publication is kept until the next one."""
        self.published = (published, policy_version)
        fresh = self._finish_replacements(self.carried)
        metrics: dict[str, float] | None = None
        engines = [engine for engine in self.engines if not engine.lost and engine.rank not in fresh]
        for engine, loaded in zip(engines, deliver(published, policy_version, [e.handle for e in engines], _remote)):
            try:
                answer = ray.get(loaded, timeout=self.timeout_s)
            except (RayActorError, GetTimeoutError) as error:
                self._lose(engine, error, self.carried)
                continue
            engine.behind = False
            metrics = metrics if metrics is not None else answer
        if metrics is None:  # no engine but fresh replacements took it: their load was not timed here
            metrics = {"perf/weight_sync_bytes": 0.0, "perf/weight_sync_buckets": float(published.buckets)}
        return metrics

    def evaluate(self, prompts: PromptBatch, required_version: int) -> tuple[Trajectory, dict[str, float]]:
        """Held-out prompts on the first live engine (S-OPS-2); another one if it is lost."""
        self._finish_replacements(self.carried)
        while True:
            engine = self._live()[0]
            trajectory, summary = engine.handle.evaluate.options(num_returns=2).remote(prompts, required_version)
            try:
                answer = ray.get([trajectory, summary], timeout=self.timeout_s)
            except (RayActorError, GetTimeoutError) as error:
                self._lose(engine, error, self.carried)
                continue
            return answer[0], answer[1]

    # --- losing and replacing an engine ------------------------------------------

    @staticmethod
    def _serves(engine: Engine) -> bool:
        return not engine.lost and not engine.behind

    def _live(self, last: str = "") -> list[Engine]:
        live = [engine for engine in self.engines if self._serves(engine)]
        if not live:
            count = len(self.engines)
            raise RolloutEngineLost(f"every rollout engine is lost ({count} of {count}){last}")
        return live

    def _least_busy(self) -> Engine:
        return min(self._live(), key=lambda engine: (engine.outstanding, engine.rank))

    def _lose(self, engine: Engine, error: Exception, faults: Faults) -> EngineLost:
        """Kill `engine`, count it against the run's bound and start its replacement;
        returns the loss's record (the earlier one, for an engine already lost)."""
        if engine.lost:
            assert engine.loss is not None
            return engine.loss
        engine.lost = True
        kill_quietly(engine.handle)
        if not self.max_replacements:  # nothing may be replaced: the engine's own failure, named as any role's
            raise error
        record = EngineLost(engine.rank, engine.node, _why(error, self.timeout_s))
        if self.replaced >= self.max_replacements:
            raise RolloutEngineLost(
                f"{record.describe()}; the run has already replaced {self.replaced} engine(s) "
                f"(rl.rollout.max_engine_replacements={self.max_replacements})"
            )
        self._live(f"; the last was {record.what()}")
        self.replaced += 1
        faults.lost += 1
        self.pending.append(Replacement(engine, self._launch(engine.rank), time.time()))
        faults.events.append(record)
        engine.loss = record
        return record

    def _regenerate(self, batch: GenerateRound, call: ShardCall, error: Exception, iteration: int) -> None:
        """`call` failed: its engine is lost, and its shard and every other one still
        queued there go once more to the least busy survivor, same index, same version,
        recorded with the loss."""
        record = self._lose(call.engine, error, batch.faults)
        for lost in [call, *batch.take_back(call.engine)]:
            survivor = self._least_busy()
            regeneration = Regeneration(iteration, lost.shard, batch.count, survivor.rank,
                                        time.monotonic() - lost.submitted)
            record.regenerated.append(regeneration)
            batch.submit(lost.shard, survivor, regeneration)

    def _gather(self, done: list[ShardCall], faults: Faults) -> tuple[Trajectory, dict[str, Any]]:
        """The shards merged by a live engine, exactly as engine 0 merges them."""
        parts, summaries = [call.trajectory for call in done], [call.summary for call in done]
        while True:
            engine = self._live()[0]
            merged = engine.handle.gather.options(num_returns=2).remote(len(done), *parts, *summaries)
            try:
                trajectory, summary = ray.get(merged, timeout=self.timeout_s)
                return trajectory, summary
            except (RayActorError, GetTimeoutError) as error:
                self._lose(engine, error, faults)

    def _launch(self, rank: int) -> Any:
        launch = self.launches[rank]
        name = f"rollout-rank{rank}-replacement{self.replaced}"
        return ray.remote(launch.role).options(
            name=name, namespace=launch.namespace, max_restarts=0, **launch.options
        ).remote(*launch.args)

    def _finish_replacements(self, faults: Faults) -> set[int]:
        """Wait for each started replacement, hand it the current weights and version
        (S-ELASTIC-1), and put it in the lost engine's place; returns their ranks. Called
        at the start of the pool's next call, not when the loss is handled: a new engine
        starts (a vLLM engine in minutes) while the iteration trains, and the rollout
        stage that lost one waits only for the regenerated shard."""
        fresh = set()
        while self.pending:
            replacement = self.pending.pop(0)
            handle, lost = replacement.handle, replacement.lost
            waited = time.monotonic()
            built = ray.get(handle.ready.remote(), timeout=self.ready_timeout_s)["built_at"]
            version, behind, loading = 0, False, 0.0
            if self.published is not None:
                published, version = self.published
                loading = time.monotonic()
                try:
                    ray.get(deliver(published, version, [handle], _remote), timeout=self.ready_timeout_s)
                except RayTaskError as error:
                    if not isinstance(error.cause, WeightTransferError):
                        raise
                    behind = True  # the policy staged a newer version over it: the next load brings that one
                loading = time.monotonic() - loading
            # Its own cost: start-up (launch to built) and the weight load, whatever overlapped it.
            seconds = max(0.0, built - replacement.started) + loading
            faults.replace_seconds += seconds
            lost.handle, lost.lost, lost.behind, lost.outstanding, lost.loss = handle, False, behind, 0, None
            self._locate([lost])
            faults.events.append(
                EngineReplaced(lost.rank, lost.node, version, behind, seconds, time.monotonic() - waited)
            )
            fresh.add(lost.rank)
        return fresh

    def _locate(self, engines: list[Engine]) -> None:
        where = actor_whereabouts({engine.rank: engine.handle for engine in engines})
        addresses = node_addresses()
        for engine in engines:
            node = where.get(engine.rank, (None, None))[1]
            engine.node = node_name(node, addresses) if node else "an unknown node"


def _remote(method: Any, *args: Any) -> Any:
    return method.remote(*args)


def _why(error: BaseException, timeout_s: float | None) -> str:
    if isinstance(error, GetTimeoutError):
        return f"no answer within {timeout_s:g} s (rl.rollout.engine_timeout_seconds)"
    return f"its process is gone ({first_line(error)[:200]})"


@ray.remote(num_cpus=0)
def ask_stuck(pool: Any) -> tuple[int, Any, str] | None:
    """The pool's `stuck`, asked from a caller of its own (see `EnginePool.stuck`)."""
    return ray.get(pool.stuck.remote())
