"""The PPO iteration with the role bodies called directly: no Prefect, no Ray.

Why: it is the baseline the orchestration is measured against (`bench.overhead`),
a fast way to run a learning curve (`bench.learning`, the learning test), and the
other half of an equivalence check: the flow must give the same metrics and
weights as this loop, because every role is an ordinary class (DESIGN.md, "A role
body is an ordinary class you can construct and test in-process").

The loop mirrors `flows.ppo.run_iterations` call for call (S-FLOW-1): the same role
methods, the same arguments, the same order, and the same metric record per
iteration. The only keys whose *values* differ are wall-clock ones (`time/*`, and
the roles' own `*_seconds`). Checkpoint commits are not part of it: they add no
metric keys, and a run here never resumes.

    from bench.direct_loop import run_direct_with_roles
    records, roles = run_direct_with_roles(config)   # roles.policy.model holds the final weights
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any, Callable

from algorithm.update_plan import UpdatePlan
from algorithm.warmup import is_critic_warmup
from configs.schema import PPOConfig
from placement.plan import plan_placement
from placement.role_placement import role_placements
from roles.critic_role import CriticRole
from roles.data_role import DataRole
from roles.policy_role import PolicyRole
from roles.reference_role import ReferenceRole
from roles.replay_role import ReplayRole
from roles.reward_role import RewardRole
from roles.rollout_role import RolloutRole

# Stage names as the flow writes them into `time/<stage>_seconds`. "train" is both
# trainers: the flow runs them concurrently, this loop one after the other (their own
# durations are in `perf/policy_train_seconds` and `perf/critic_train_seconds`).
# The data cursor is timed with rollout and the replay buffer with reward, as the flow
# folds them into those tasks.
STAGES = (
    "rollout", "reward", "reference_score", "critic_predict", "prepare_batch", "train", "weight_sync",
)


@dataclass
class DirectRoles:
    """The role objects themselves (not actor handles), so a caller can read the
    final weights and state after a run: `roles.policy.model.state_dict()`."""

    data: DataRole
    rollout: RolloutRole
    reward: RewardRole
    replay: ReplayRole
    reference: ReferenceRole
    critic: CriticRole
    policy: PolicyRole

    def items(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


def build_roles(config: PPOConfig) -> DirectRoles:
    """Every role in this process, constructed in `roles.actors.ROLE_CLASSES` order
    (the tiny model is built on first use, as in the flow). Each device role gets
    rank 0's placement from the same `role_placements` the actors are started with."""
    placements = role_placements(plan_placement(config))
    return DirectRoles(
        data=DataRole(config),
        rollout=RolloutRole(config, placements["rollout"][0]),
        reward=RewardRole(config),
        replay=ReplayRole(config),
        reference=ReferenceRole(config, placements["reference"][0]),
        critic=CriticRole(config, placements["critic"][0]),
        policy=PolicyRole(config, placements["policy"][0]),
    )


def run_direct(
    config: PPOConfig,
    max_steps: int | None = None,
    *,
    roles: DirectRoles | None = None,
    start: int = 1,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run iterations `start..max_steps` (default `rl.max_steps`) and return one
    metric record per iteration, with the keys `flows.ppo.run_iterations` writes.

    Args:
        config: the run configuration (the same object the flow would resolve).
        max_steps: last outer iteration to run; None means `config.rl.max_steps`.
        roles: role objects to drive; built from `config` when None. Pass your own
            to inspect them afterwards (final weights, optimizer, cursor).
        start: first outer iteration (1 for a fresh run).
        on_iteration: called with each record as soon as it is complete.
    """
    rl = config.rl
    last = rl.max_steps if max_steps is None else max_steps
    roles = build_roles(config) if roles is None else roles
    warmup = rl.critic_warmup_iterations
    policy_version = roles.policy.policy_version
    records: list[dict[str, Any]] = []
    for iteration in range(start, last + 1):
        iteration_started = time.perf_counter()
        record: dict[str, Any] = {"iteration": iteration}
        stage_seconds: dict[str, float] = {}

        def timed(stage: str, fn, *args):
            t0 = time.perf_counter()
            result = fn(*args)
            stage_seconds[stage] = stage_seconds.get(stage, 0.0) + time.perf_counter() - t0
            return result

        prompts, m = timed("rollout", roles.data.next_batch, iteration, rl.batch_size)
        record.update(m)
        trajectory, m = timed("rollout", roles.rollout.generate, prompts, policy_version)
        record.update(m)
        trajectory, m = timed("reward", roles.reward.score, trajectory)
        record.update(m)
        trajectory, _, _ = timed("reward", roles.replay.add, trajectory)
        trajectory, _ = timed("reference_score", roles.reference.score, trajectory)
        trajectory, m = timed("critic_predict", roles.critic.predict, trajectory)
        record.update(m)
        t0 = time.perf_counter()
        targets, m = roles.policy.prepare_batch(trajectory)
        batch_id = roles.critic.install_targets(targets)["batch_id"]  # the same object (S-FLOW-3)
        stage_seconds["prepare_batch"] = time.perf_counter() - t0
        record.update(m)

        plan = UpdatePlan(rl.epochs, rl.minibatch_size, rl.micro_batch_size, config.job.seed, iteration)
        actor_warmup = is_critic_warmup(iteration, warmup)
        t0 = time.perf_counter()
        critic_receipt = roles.critic.train_batch(plan, batch_id)
        receipts = [critic_receipt]
        if not actor_warmup:
            receipts = [roles.policy.train_batch(plan, batch_id), critic_receipt]  # the flow's merge order
        stage_seconds["train"] = time.perf_counter() - t0
        for receipt in receipts:
            if receipt.batch_id != batch_id:  # S-FLOW-5, as the flow checks it
                raise RuntimeError(f"iteration {iteration}: {receipt.role} trained on {receipt.batch_id}, not {batch_id}")
            record.update(receipt.metrics)

        if not actor_warmup:  # S-CW-5: no weight delta, no transfer during warmup
            t0 = time.perf_counter()
            weights, policy_version = roles.policy.publish_weights()
            m = roles.rollout.load_weights(weights, policy_version)
            stage_seconds["weight_sync"] = time.perf_counter() - t0
            record.update(m)
        # The policy's last call of the iteration, as the flow queues it (S-RUN-4); `{}`
        # unless the policy shares a GPU with the rollout, so CPU records are unchanged.
        record.update(roles.policy.park())
        record["train/actor_warmup"] = 1.0 if actor_warmup else 0.0
        record["train/policy_version"] = float(policy_version)
        for stage, seconds in stage_seconds.items():
            record[f"time/{stage}_seconds"] = seconds
        record["time/iteration_seconds"] = time.perf_counter() - iteration_started
        records.append(record)
        if on_iteration is not None:
            on_iteration(record)
    return records


def run_direct_with_roles(config: PPOConfig, max_steps: int | None = None) -> tuple[list[dict[str, Any]], DirectRoles]:
    """`run_direct` on freshly built roles, returning them too (final weights, optimizer
    state, data cursor) for comparisons with a flow run."""
    roles = build_roles(config)
    return run_direct(config, max_steps, roles=roles), roles

