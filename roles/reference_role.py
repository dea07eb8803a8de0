"""The frozen reference: log-probs of the sampled tokens under the initial model,
for the KL penalty in the reward. It scores on its own group's device (S-RUN-4: its
own GPU, or the host when `grid.reference_gpus=0`) and never parks."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from configs.schema import PPOConfig
from models.model_io import ensure_model, load_causal_lm, model_device, response_logprobs
from placement.role_placement import RolePlacement
from roles.trajectory import Trajectory
from trainer.runtime import configure_torch_threads


class ReferenceRole:
    def __init__(self, config: PPOConfig, placement: RolePlacement):
        configure_torch_threads(config.rl.threads_per_role)
        self.temperature = config.rl.rollout.temperature
        self.device = placement.on_visible_device().device
        self.model = load_causal_lm(ensure_model(config.model), config.model.dtype).eval()
        if self.device != "cpu":
            self.model.to(self.device)
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)

    def ready(self) -> dict[str, Any]:
        return {"role": "reference", "device": str(model_device(self.model))}

    @torch.no_grad()
    def score(self, trajectory: Trajectory) -> tuple[Trajectory, dict[str, float]]:
        input_ids, attention_mask = trajectory.sequences()
        ref_logprobs = response_logprobs(
            self.model, input_ids, attention_mask, trajectory.prompt_length, self.temperature, trajectory.extras
        ).cpu() * trajectory.response_mask  # on the host: the trajectory goes back to the object store
        return dataclasses.replace(trajectory, ref_logprobs=ref_logprobs), {}
