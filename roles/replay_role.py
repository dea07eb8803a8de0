"""The replay role: the experience buffer between rollout and training.

PPO here is on-policy, so the buffer holds exactly the current batch. Its job is to
give that batch an identity every trainer will quote in its receipt (S-FLOW-5).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from configs.schema import PPOConfig
from roles.trajectory import Trajectory, batch_identity


class ReplayRole:
    def __init__(self, config: PPOConfig):
        pass

    def ready(self) -> dict[str, Any]:
        return {"role": "replay"}

    def add(self, trajectory: Trajectory) -> tuple[Trajectory, dict[str, Any], str]:
        """The batch id comes back twice: in the summary the flow logs, and on its own
        so the trainers' calls can be queued on it before this call has even run."""
        batch_id = batch_identity(trajectory)
        return dataclasses.replace(trajectory, batch_id=batch_id), {"batch_id": batch_id}, batch_id
