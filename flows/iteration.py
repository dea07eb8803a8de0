"""One PPO iteration (S-FLOW-1), written once and run two ways: over Ray actors with
one Prefect task per stage (flows/flow_runner.py), or in process on plain role objects
(flows/in_process_runner.py). The loop over a run's iterations is flows/iteration_loop.py.

`ppo_iteration` first queues every role call of the iteration in stage order (each
call takes the previous stage's output, so the bulk moves role to role and never
through the controller, S-FLOW-2), then waits stage by stage. The same shape as
OpenRLHF's train_step: the verbs in order, queued first, then gathered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from algorithm.update_plan import UpdatePlan
from algorithm.warmup import is_critic_warmup
from checkpoint.boundary import CommittedBoundary, boundary_name, boundary_path, clear_for_commit
from configs.schema import PPOConfig
from checkpoint.in_flight import IN_FLIGHT_DIR, holds_in_flight
from contracts.scored_batch import ScoredBatch
from contracts.stage_names import ROLLOUT, TRAIN, time_key
from placement.plan import TRAINER_ROLES
from checkpoint.role_layout import REWARD_DIR
from rundir.reward_model_identity import keeps_reward_state
from rundir.run_identity import RunIdentity, record_identity
from rundir.run_outputs import RunPaths
from tasks import commit as commit_stage
from tasks import stages
from weights.transport import deliver


class Runner(Protocol):
    seconds: dict[str, float]

    def start_iteration(self) -> None: ...
    def call(self, method: Any, *args: Any, returns: int = 1) -> Any: ...
    def stage(self, body: Callable[..., Any], iteration: int, *args: Any, waits: Sequence[Any] = ()) -> Any: ...
    def concurrent_stages(
        self, label: str, iteration: int, *stages: tuple[Callable[..., Any], tuple[Any, ...]]
    ) -> list[Any]: ...
    def start_stage(self, body: Callable[..., Any], iteration: int, *args: Any) -> Any: ...
    def finish_stage(self, started: Any) -> tuple[Any, float]: ...
    def get(self, pending: Any) -> Any: ...


if TYPE_CHECKING:
    from flows.in_process_roles import InProcessRoles
    from processes.actors import RoleHandles

    Roles = RoleHandles | InProcessRoles
    """Actor handles or role objects: each role's rank 0 as an attribute (`roles.policy`),
    every rank through `ranks`. Typed per role, so `roles.data.next_batch` leads to
    DataRole.next_batch."""


@dataclass
class Batch(ScoredBatch[Any]):
    """One iteration's samples, queued: generated and scored, with the summaries its
    metrics row reports. One step off, the next iteration's batch is queued during this
    one (S-ASYNC-1) and its rollout stage's metrics are kept here until its row."""

    iteration: int
    rollout_record: dict[str, float] | None = None  # its finished rollout stage: metrics and time
    started_rollout: Any = None  # one step off: its rollout stage, started beside the iteration before

    def rollout_metrics(self, run: Runner) -> dict[str, float]:
        """Its rollout stage's row entries: waited for now, or kept from the iteration
        that generated it (one step off)."""
        if self.rollout_record is not None:
            return self.rollout_record
        return run.stage(stages.rollout, self.iteration, self.data_summary, self.rollout_summary)

    def finish_rollout(self, run: Runner) -> None:
        """One step off: wait for the rollout stage started beside this iteration and
        keep its entries for the row of the iteration this batch belongs to."""
        metrics, seconds = run.finish_stage(self.started_rollout)
        self.rollout_record = {**metrics, time_key(ROLLOUT): seconds}


@dataclass
class QueuedTargets:
    """One batch's calls from the replay buffer to the PPO targets every trainer rank
    holds, queued: rank 0's outputs go on, the other ranks' are waited for."""

    replay_summary: Any
    batch_id: Any
    references: list[Any]  # every reference rank's (trajectory, summary)
    predictions: list[Any]  # every critic rank's (trajectory, summary)
    prepared: list[Any]  # every policy rank's (targets, summary)
    experience: Any  # the experience file's receipt, or None
    installs: list[Any]  # every other trainer rank's copy of the targets


@dataclass
class IterationResult:
    record: dict[str, Any]  # one metrics.jsonl row, less the iteration's total time
    policy_version: int
    committed: CommittedBoundary | None
    ahead: Batch | None = None  # one step off: the next iteration's batch, already generated


def ppo_iteration(
    run: Runner, roles: Roles, config: PPOConfig, iteration: int, policy_version: int, paths: RunPaths | None = None,
    batch: Batch | None = None, identity: RunIdentity | None = None,
) -> IterationResult:
    """`batch`: this iteration's samples when the previous iteration generated them
    (one step off); otherwise they are generated here, with the current weights."""
    rl = config.rl
    run.start_iteration()
    plan = UpdatePlan.from_config(rl, config.job.seed, iteration)
    policy_ranks, critic_ranks = roles.policy_ranks(), roles.critic_ranks()

    # Queue: generate, score, reference, values, targets, updates, weight sync, park.
    batch = batch or queue_batch(run, roles, config, iteration, policy_version)
    ahead = queue_ahead(run, roles, config, iteration, policy_version)  # one step off: the next batch
    queued = queue_targets(run, roles, config, batch, paths)
    batch_id = queued.batch_id
    critic_receipts = [run.call(rank.train_batch, plan, batch_id) for rank in critic_ranks]
    # S-CW-2/5, decided once: during warmup nothing touches the actor and no weights move.
    actor = None if is_critic_warmup(iteration, rl.critic_warmup_iterations) else queue_actor_update(
        run, roles, plan, batch_id
    )
    # The policy's last call: park on the host so the next rollout has the GPU (S-RUN-4).
    parks = [run.call(rank.park) for rank in policy_ranks]

    # Gather: one task per stage, in order.
    record: dict[str, Any] = {"iteration": iteration, **batch.rollout_metrics(run)}
    record |= run.stage(stages.reward, iteration, batch.reward_summary, queued.replay_summary)
    (_, reference_summary), *other_references = queued.references
    record |= run.stage(stages.reference_score, iteration, reference_summary, waits=[s for _, s in other_references])
    if queued.predictions:  # a critic-free estimator has no critic stages (S-OPT-2)
        (_, critic_summary), *other_predictions = queued.predictions
        record |= run.stage(stages.critic_predict, iteration, critic_summary, waits=[s for _, s in other_predictions])
    (_, prepare_summary), *other_prepared = queued.prepared
    agreed_batch, prepare_metrics = run.stage(
        stages.prepare_batch, iteration, prepare_summary, queued.installs, waits=[s for _, s in other_prepared],
    )
    record |= prepare_metrics
    # The experience file is written while the trainers update; the last train stage
    # (the critic's, or the policy's without a critic) waits for it, so it is on disk
    # before any commit that vouches for this iteration.
    experience_after_policy = queued.experience if not critic_ranks else None
    # During warmup the park is waited for with the critic, the iteration's last task.
    trains = [] if actor is None else [(stages.train_policy, (actor.receipts, agreed_batch, experience_after_policy))]
    if critic_ranks:
        trains.append(
            (stages.train_critic, (critic_receipts, agreed_batch, parks if actor is None else [], queued.experience))
        )
    for metrics in run.concurrent_stages(TRAIN, iteration, *trains):
        record |= metrics
    if ahead is not None:
        ahead.finish_rollout(run)
    if actor is not None:
        policy_version, synced = run.stage(
            stages.weight_sync, iteration, actor.loaded, actor.new_version, parks, waits=actor.follows
        )
        record |= synced
    record["train/actor_warmup"] = 1.0 if actor is None else 0.0
    record["train/policy_version"] = float(policy_version)
    if evaluates_at(config, iteration):
        # After weight_sync (every policy rank parked, the engines hold the new
        # version) and before the commit, which keeps this row (S-OPS-2, S-FAULT-2).
        record |= evaluate(run, roles, iteration, policy_version)

    record |= {time_key(stage): seconds for stage, seconds in run.seconds.items()}
    committed = save_on_cadence(
        run, roles, config, iteration, policy_version, paths, record, ahead, identity=identity
    )
    record |= {time_key(stage): seconds for stage, seconds in run.seconds.items()}
    return IterationResult(record, policy_version, committed, ahead)


def queue_batch(run: Runner, roles: Roles, config: PPOConfig, iteration: int, policy_version: int) -> Batch:
    """The prompts of `iteration`, rl.rollout.samples_per_prompt completions each with the
    weights the engines hold (`policy_version`), scored."""
    prompts, data_summary = run.call(
        roles.data.next_batch, iteration, config.rl.batch_size, config.rl.rollout.samples_per_prompt, returns=2
    )
    trajectory, rollout_summary = generate(run, roles, prompts, policy_version)
    trajectory, reward_summary = run.call(roles.reward.score, trajectory, returns=2)
    return Batch(trajectory, data_summary, rollout_summary, reward_summary, iteration=iteration)


def queue_ahead(run: Runner, roles: Roles, config: PPOConfig, iteration: int, policy_version: int) -> Batch | None:
    """One step off (S-ASYNC-1): the next iteration's batch, with the weights the engines
    hold now, generated while this iteration trains (its rollout stage started beside
    this iteration's); the engines load this iteration's weights after it. None when
    the run is synchronous or this is its last iteration."""
    if not generates_ahead(config, iteration):
        return None
    ahead = queue_batch(run, roles, config, iteration + 1, policy_version)
    ahead.started_rollout = run.start_stage(stages.rollout, iteration + 1, ahead.data_summary, ahead.rollout_summary)
    return ahead


def queue_targets(run: Runner, roles: Roles, config: PPOConfig, batch: Batch, paths: RunPaths | None) -> QueuedTargets:
    """Replay, reference, values, then the frozen PPO targets on every trainer rank."""
    trajectory, replay_summary, batch_id = run.call(roles.replay.add, batch.trajectory, returns=3)
    # A sharded model's forward gathers its weights from every rank, so every rank
    # runs it on the same batch (S-SCALE-1); rank 0's result goes on.
    references = [run.call(rank.score, trajectory, returns=2) for rank in roles.reference_ranks()]
    trajectory = references[0][0]
    critic_ranks, policy_ranks = roles.critic_ranks(), roles.policy_ranks()
    predictions = [run.call(rank.predict, trajectory, returns=2) for rank in critic_ranks]
    if predictions:  # none without a critic: the policy's estimator needs no values
        trajectory = predictions[0][0]
    # Rank 0 of the policy freezes the targets; every other trainer rank receives
    # that very object (S-FLOW-3), the policy's after computing the same for the forward.
    prepared = [run.call(rank.prepare_batch, trajectory, returns=2) for rank in policy_ranks]
    targets = prepared[0][0]
    experience = None
    if paths is not None and config.job.experience.keep != "off":  # S-OPS-3: the samples behind the numbers
        experience = run.call(roles.replay.keep_experience, trajectory, targets, paths.experience)
    # Alone (one policy rank, no critic), rank 0 installs its own targets: its answer
    # names the batch the prepare stage hands out (S-FLOW-5).
    receivers = critic_ranks + policy_ranks[1:] or policy_ranks[:1]
    installs = [run.call(rank.install_targets, targets) for rank in receivers]
    return QueuedTargets(replay_summary, batch_id, references, predictions, prepared, experience, installs)


def generates_ahead(config: PPOConfig, iteration: int) -> bool:
    """One step off, every iteration but the run's last generates the next one's batch."""
    return config.rl.rollout.max_staleness > 0 and iteration < config.rl.max_steps


def held_batch(run: Runner, roles: Roles, boundary: str, iteration: int) -> Batch | None:
    """The next iteration's batch a one-step-off boundary of `iteration` holds, if any."""
    folder = f"{boundary}/{IN_FLIGHT_DIR}"
    if not holds_in_flight(folder):
        return None
    parts = run.call(roles.replay.load_in_flight, folder, returns=ScoredBatch.PARTS)
    return Batch(*parts, iteration=iteration + 1)


@dataclass
class ActorUpdate:
    """The actor's part of one iteration, queued: every policy rank's update, and the
    new weights published and loaded into every rollout engine (S-FLOW-6)."""

    receipts: list[Any]
    loaded: list[Any]
    new_version: Any
    follows: list[Any]  # the other policy ranks' (equal) clocks


def queue_actor_update(run: Runner, roles: Roles, plan: UpdatePlan, batch_id: Any) -> ActorUpdate:
    policy_ranks = roles.policy_ranks()
    receipts = [run.call(rank.train_batch, plan, batch_id) for rank in policy_ranks]
    # Takes every rank's receipt: a failed update publishes nothing (S-FLOW-6). Every
    # rank takes part in gathering the full weights from its shards (S-SCALE-3); rank 0
    # hands them to the engines.
    published = [run.call(rank.publish_weights, *receipts, returns=2) for rank in policy_ranks]
    weights, new_version = published[0]
    loaded = deliver(weights, new_version, roles.engines(), run.call)
    return ActorUpdate(receipts, loaded, new_version, [version for _, version in published[1:]])


def evaluates_at(config: PPOConfig, iteration: int) -> bool:
    """Whether the policy after `iteration` is evaluated (0: the starting policy)."""
    validation = config.rl.validation
    if validation is None:
        return False
    if iteration == 0:
        return validation.before_training
    return validation.every > 0 and iteration % validation.every == 0


def first_step(config: PPOConfig, start: int) -> int:
    """The first metrics row a run starting at iteration `start` writes."""
    return 0 if start == 1 and evaluates_at(config, 0) else start


def evaluate(run: Runner, roles: Roles, iteration: int, policy_version: int) -> dict[str, float]:
    """Held-out prompts through rollout engine 0 with the current weights, scored by
    the reward role (S-OPS-2). Nothing here moves the data cursor or any sampling
    stream training uses, so evaluating never changes training."""
    prompts = run.call(roles.data.validation_batch, iteration)
    trajectory, summary = run.call(roles.engines()[0].evaluate, prompts, policy_version, returns=2)
    scores = run.call(roles.reward.score_validation, trajectory)
    return run.stage(stages.evaluate, iteration, summary, scores)


def generate(run: Runner, roles: Roles, prompts: Any, policy_version: int) -> tuple[Any, Any]:
    """One completion per row (S-FLOW-7), from the run's one engine or from the pool
    of its several, which shards the batch over them (processes/engine_pool.py)."""
    return run.call(roles.engines()[0].generate, prompts, policy_version, returns=2)


def save_kind(config: PPOConfig, iteration: int) -> str | None:
    """"full" (a committed, resumable boundary), "model" (a weights-only artifact) or
    None. The final save is always full so a finished run can be extended (S-CKPT-5)."""
    rl = config.rl
    if rl.save_final and iteration == rl.max_steps:
        return "full"
    if rl.save_every and iteration % rl.save_every == 0:
        return rl.save_plan
    return None


def save_on_cadence(
    run: Runner, roles: Roles, config: PPOConfig, iteration: int, policy_version: int, paths: RunPaths | None,
    record: dict[str, Any], ahead: Batch | None = None, kind: str | None = None, identity: RunIdentity | None = None,
) -> CommittedBoundary | None:
    """Queued only after every stage succeeded, so a failed iteration writes nothing
    into its boundary. Every rank of each trainer saves its shards; every rank loads on resume. The
    boundary also keeps the iteration's metrics row: a crash after the pointer moved
    but before the row reached metrics.jsonl must not lose it (S-FAULT-2). `identity`: the
    run's, read at launch (rundir/run_identity.py); the boundary records it."""
    kind = (kind or save_kind(config, iteration)) if paths is not None else None
    if kind == "full":
        boundary = boundary_path(paths.checkpoints, iteration)
        clear_for_commit(paths.checkpoints, iteration)  # S-FAULT-3: saves never mix with an older folder's files
        saves = rank_saves(run, roles, boundary)
        saves["data"] = run.call(roles.data.save, f"{boundary}/data")
        if ahead is not None:  # S-ASYNC-3: resume trains on this very batch, neither skipped nor regenerated
            saves["in_flight"] = run.call(roles.replay.save_in_flight, f"{boundary}/{IN_FLIGHT_DIR}", *ahead.parts())
        loop_state = record_identity(identity or RunIdentity.at_launch(config), boundary)  # S-CKPT-4
        if keeps_reward_state(config):  # S-RM-1: the running normalisation goes on exactly
            saves["reward"] = run.call(roles.reward.save, f"{boundary}/{REWARD_DIR}")
        return run.stage(
            commit_stage.commit, iteration, saves, boundary, paths.checkpoints, policy_version, loop_state,
            config.rl.keep_optim_last, record,
        )
    if kind == "model":
        folder = f"{paths.artifacts}/{boundary_name(iteration)}"
        saves = rank_saves(run, roles, folder, "model")
        run.stage(commit_stage.save_artifact, iteration, folder, waits=[saves])
    return None


def rank_saves(run: Runner, roles: Roles, folder: str, plan: str = "full") -> dict[str, Any]:
    """Every rank of each trainer saves at once (a sharded save is a collective,
    S-SCALE-2). Keyed by role for rank 0, whose report the marker records, and by
    `role-rankN` for the others, so the commit waits for every rank's verified save
    before its `_SUCCESS` (S-CKPT-2)."""
    saves = {}
    for role in TRAINER_ROLES:  # a role this run does not start has no ranks
        for rank, handle in enumerate(roles.ranks(role)):
            saves[role if rank == 0 else f"{role}-rank{rank}"] = run.call(handle.save, f"{folder}/{role}", plan)
    return saves
