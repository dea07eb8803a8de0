"""The seven role bodies, listed once: the actors, the in-process runner and the fork
server's preload all take them from here (S-RUN-5: one actor group per role)."""

from __future__ import annotations

from roles.critic_role import CriticRole
from roles.data_role import DataRole
from roles.policy_role import PolicyRole
from roles.reference_role import ReferenceRole
from roles.replay_role import ReplayRole
from roles.reward_role import RewardRole
from roles.rollout_role import RolloutRole

ROLE_CLASSES: dict[str, type] = {
    "data": DataRole,
    "rollout": RolloutRole,
    "reward": RewardRole,
    "replay": ReplayRole,
    "reference": ReferenceRole,
    "critic": CriticRole,
    "policy": PolicyRole,
}
