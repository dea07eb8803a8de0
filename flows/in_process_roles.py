"""Every role as a plain object in this process, the in-process runner's counterpart of
the run's actor handles (processes/actors.py RoleHandles)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

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


@dataclass
class InProcessRoles:
    """The role objects themselves (not actor handles), so a caller can read the
    final weights and state after a run: `roles.policy.model.state_dict()`. One of
    each role: data-parallel ranks and several engines need their own processes."""

    data: DataRole
    rollout: RolloutRole
    reward: RewardRole
    replay: ReplayRole
    reference: ReferenceRole
    policy: PolicyRole
    critic: CriticRole | None = None  # None: a critic-free estimator (S-OPT-2)

    def items(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def ranks(self, role: str) -> list[Any]:
        return [] if getattr(self, role) is None else [getattr(self, role)]

    def policy_ranks(self) -> list[PolicyRole]:
        return [self.policy]

    def critic_ranks(self) -> list[CriticRole]:
        return self.ranks("critic")

    def reference_ranks(self) -> list[ReferenceRole]:
        return [self.reference]

    def engines(self) -> list[RolloutRole]:
        return [self.rollout]


def build_roles(config: PPOConfig) -> InProcessRoles:
    """Every role in this process, constructed in `roles.bodies.ROLE_CLASSES` order
    (the tiny model is built on first use, as in the flow). Each role gets rank 0's
    placement from the same `role_placements` the actors are started with."""
    placements = role_placements(plan_placement(config))
    return InProcessRoles(
        data=DataRole(config, placements["data"][0]),
        rollout=RolloutRole(config, placements["rollout"][0]),
        reward=RewardRole(config, placements["reward"][0]),
        replay=ReplayRole(config, placements["replay"][0]),
        reference=ReferenceRole(config, placements["reference"][0]),
        critic=CriticRole(config, placements["critic"][0]) if "critic" in placements else None,
        policy=PolicyRole(config, placements["policy"][0]),
    )
