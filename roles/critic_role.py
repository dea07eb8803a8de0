"""The critic role: value predictions for GAE and value-function training on the
targets the policy froze (S-FLOW-3).

It trains on its own group's device (its own GPU in both placements, so it never
parks, S-RUN-4) and hands values back on the host, for the object store."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict
from typing import Any

import torch

from algorithm.ppo_math import clipped_value_loss
from algorithm.update_plan import UpdatePlan
from configs.schema import PPOConfig
from models.model_io import ensure_model, load_value_model, response_values
from trainer.data_parallel import rendezvous_address
from placement.role_placement import RolePlacement
from trainer.runtime import configure_torch_threads
from roles.trajectory import PPOTargets, TrainReceipt, Trajectory
from trainer.update_runtime import UpdateRuntime


class CriticRole:
    def __init__(self, config: PPOConfig, placement: RolePlacement):
        configure_torch_threads(config.rl.threads_per_role)
        self.rl = config.rl
        self.rank = placement.rank
        model = load_value_model(ensure_model(config.model), config.model.dtype, seed=config.job.seed)
        self.runtime = UpdateRuntime(
            "critic", model, config.rl.optimizer, config.rl.optimizer.critic_lr, placement.on_visible_device().device
        )
        self.targets: PPOTargets | None = None

    @property
    def model(self) -> torch.nn.Module:
        return self.runtime.model

    def ready(self) -> dict[str, Any]:
        return {
            "role": "critic",
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "device": str(self.runtime.device),
            "rank": self.rank,
            "ranks": self.runtime.data_parallel.world,
        }

    def rendezvous_address(self) -> str:
        """Rank 0's listening address for its role's process group."""
        return rendezvous_address()

    def join_data_parallel(self, address: str, rank: int, world: int) -> dict[str, Any]:
        """Join the critic's process group (every rank at once) and take rank 0's weights,
        value head included (each rank drew its own at start-up)."""
        self.runtime.join_data_parallel(address, rank, world)
        return self.ready()

    @torch.no_grad()
    def predict(self, trajectory: Trajectory) -> tuple[Trajectory, dict[str, float]]:
        self.model.eval()
        input_ids, attention_mask = trajectory.sequences()
        values = response_values(
            self.model, input_ids, attention_mask, trajectory.prompt_length, trajectory.extras
        ).cpu() * trajectory.response_mask
        mean = float(values.sum() / trajectory.response_mask.sum().clamp(min=1))
        return dataclasses.replace(trajectory, values=values), {"critic/value_mean": mean}

    def install_targets(self, targets: PPOTargets) -> dict[str, str]:
        self.targets = targets
        return {"batch_id": targets.batch_id}

    def _loss(self, targets: PPOTargets, index: torch.Tensor):
        values = response_values(
            self.model, targets.input_ids[index], targets.attention_mask[index], targets.prompt_length,
            targets.extras, index,
        )
        output = clipped_value_loss(
            values, targets.old_values[index], targets.returns[index], targets.response_mask[index], self.rl.value_clip
        )
        return output.loss, {"loss": output.loss.detach(), "clip_fraction": output.clip_fraction}

    def train_batch(self, plan: UpdatePlan, batch_id: str) -> TrainReceipt:
        if self.targets is None or self.targets.batch_id != batch_id:
            held = self.targets.batch_id if self.targets else None
            raise ValueError(f"critic was asked to train on batch {batch_id} but holds targets for {held}")
        started = time.perf_counter()
        metrics = self.runtime.run_plan(plan, self.targets, self._loss)
        named = {
            "train/value_loss": metrics["loss"],
            "train/value_clip_fraction": metrics["clip_fraction"],
            "train/critic_grad_norm": metrics["grad_norm"],
            "optim/critic_lr": metrics["lr"],
            "optim/critic_optimizer_step": float(self.runtime.optimizer_step),
            "perf/critic_train_seconds": time.perf_counter() - started,
        }
        if self.runtime.last_allreduce_seconds is not None:  # only with data-parallel ranks
            named["perf/critic_allreduce_seconds"] = self.runtime.last_allreduce_seconds
        return TrainReceipt("critic", batch_id, self.rank, self.runtime.optimizer_step, named)

    def save(self, directory: str, plan: str = "full"):
        if plan == "model":
            return {"path": self.runtime.save_model(directory)}
        return asdict(self.runtime.save(directory, {}))

    def load(self, directory: str) -> dict[str, Any]:
        self.targets = None
        return self.runtime.load(directory)
