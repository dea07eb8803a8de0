"""The replay role: the experience buffer between rollout and training.

PPO here is on-policy, so the buffer holds exactly the current batch. Its job is to
give that batch an identity every trainer will quote in its receipt (S-FLOW-5), and
to keep the record of what was trained on: each iteration's samples with their
rewards and advantages as an experience file (S-OPS-3, contracts/experience.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from configs.schema import PPOConfig
from placement.role_placement import RolePlacement
from checkpoint.in_flight import load_in_flight, save_in_flight
from contracts.scored_batch import ScoredBatch
from contracts.experience import ExperienceReceipt, prune_experience, sample_rows, write_experience
from contracts.trajectory import PPOTargets, Trajectory, batch_identity


class ReplayRole:
    def __init__(self, config: PPOConfig, placement: RolePlacement | None = None):
        """`placement`: always the host's (the replay role holds no model)."""
        self.experience = config.job.experience

    def ready(self) -> dict[str, Any]:
        return {"role": "replay", "experience": self.experience.keep}

    def add(self, trajectory: Trajectory) -> tuple[Trajectory, dict[str, Any], str]:
        """The batch id comes back twice: in the summary the flow logs, and on its own
        so the trainers' calls can be queued on it before this call has even run."""
        batch_id = batch_identity(trajectory)
        return dataclasses.replace(trajectory, batch_id=batch_id), {"batch_id": batch_id}, batch_id

    def keep_experience(self, trajectory: Trajectory, targets: PPOTargets, directory: str) -> ExperienceReceipt:
        """Write this iteration's samples (rewards from the trajectory, advantages and
        returns from the frozen targets) and apply `job.experience` retention. Reads
        only: nothing a trainer uses is touched."""
        rows = sample_rows(trajectory, targets)
        path = write_experience(directory, trajectory.iteration, rows)
        removed = []
        if self.experience.keep == "last":
            removed = prune_experience(directory, trajectory.iteration, self.experience.last)
        return ExperienceReceipt(
            iteration=trajectory.iteration, path=path, samples=len(rows), table=rows[: self.experience.table_rows],
            removed=removed,
        )

    def save_in_flight(self, directory: str, *parts: Any) -> dict[str, Any]:
        """The next iteration's scored batch into a one-step-off boundary (S-ASYNC-3),
        given as its `ScoredBatch.parts()`."""
        return save_in_flight(directory, ScoredBatch(*parts))

    def load_in_flight(self, directory: str) -> tuple[Any, ...]:
        return load_in_flight(directory).parts()
