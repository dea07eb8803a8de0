"""The frozen reference: log-probs of the sampled tokens under the initial model,
for the KL penalty in the reward."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from configs.schema import PPOConfig
from roles.model_io import ensure_model, load_causal_lm, response_logprobs
from roles.runtime import configure_torch_threads
from roles.trajectory import Trajectory


class ReferenceRole:
    def __init__(self, config: PPOConfig):
        configure_torch_threads(config.rl.threads_per_role)
        self.temperature = config.rl.rollout.temperature
        self.model = load_causal_lm(ensure_model(config.model), config.model.dtype).eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)

    def ready(self) -> dict[str, Any]:
        return {"role": "reference"}

    @torch.no_grad()
    def score(self, trajectory: Trajectory) -> tuple[Trajectory, dict[str, float]]:
        input_ids, attention_mask = trajectory.sequences()
        ref_logprobs = response_logprobs(
            self.model, input_ids, attention_mask, trajectory.prompt_length, self.temperature, trajectory.extras
        ) * trajectory.response_mask
        return dataclasses.replace(trajectory, ref_logprobs=ref_logprobs), {}
