"""The critic role: value predictions for GAE and value-function training on the
targets the policy froze (S-FLOW-3).

It trains on its own group's device (its own GPU in both placements, so it never
parks, S-RUN-4) and hands values back on the host, for the object store."""

from __future__ import annotations

import dataclasses

import torch

from algorithm.ppo_math import clipped_value_loss
from algorithm.update_plan import MicroBatch
from configs.schema import OptimizerConfig, PPOConfig
from models.critic_source import require_critic_source
from models.lora import add_adapters
from models.cut_forward import forward_by_tokens
from models.model_io import ensure_model, load_value_model, response_values, use_attention
from models.reward_model import ensure_reward_model
from roles.trainer_role import TrainerRole
from contracts.trajectory import PPOTargets, Trajectory


def critic_start(config: PPOConfig) -> str:
    """The folder the critic's weights start from: `model.path`, or `model.critic_path`
    once it is checked to fit the policy (S-RM-2)."""
    policy = ensure_model(config.model)
    source = config.model.critic_path
    if source is None:
        return policy
    reward_model = config.rl.reward.model
    if reward_model is not None and reward_model.path == source:
        ensure_reward_model(reward_model)  # a tiny reward model is built before it can start the critic
    require_critic_source(policy, source)
    return source


class CriticRole(TrainerRole):
    role = "critic"

    def _load_model(self, config: PPOConfig) -> torch.nn.Module:
        model = use_attention(
            load_value_model(critic_start(config), config.model.dtype, seed=config.job.seed), config.model.attention
        )
        if not config.model.lora.enabled:
            return model
        # The value head is new: it trains whole beside the adapters (S-LORA-1).
        return add_adapters(model, config.model.lora, seed=config.job.seed, modules_to_save=["score"])

    def _learning_rate(self, optimizer: OptimizerConfig) -> float:
        return optimizer.critic_lr

    @torch.no_grad()
    def predict(self, trajectory: Trajectory) -> tuple[Trajectory, dict[str, float]]:
        self.model.eval()
        input_ids, attention_mask = trajectory.sequences()
        values = forward_by_tokens(
            lambda ids, mask, prompt_length, rows: response_values(
                self.model, ids, mask, prompt_length, trajectory.extras, rows, pack=self.packs_rows
            ),
            input_ids, attention_mask, trajectory.prompt_length, self.rl.micro_batch_tokens,
            keep_prompt=bool(trajectory.extras),
        ) * trajectory.action_mask  # no value on observation tokens (S-ENV-2)
        mean = float(values.sum() / trajectory.action_mask.sum().clamp(min=1))
        return dataclasses.replace(trajectory, values=values), {"critic/value_mean": mean}

    def _loss(self, targets: PPOTargets, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped value loss per token (m, r') of one micro-batch; the runtime
        aggregates it (S-PATH-2)."""
        input_ids, attention_mask, prompt_length = micro.sequences(
            targets.input_ids, targets.attention_mask, targets.prompt_length
        )
        values = response_values(
            self.model, input_ids, attention_mask, prompt_length, targets.extras, micro.rows, pack=self.packs_rows
        )
        output = clipped_value_loss(
            values, micro.response(targets.old_values), micro.response(targets.returns),
            micro.response(targets.response_mask), self.rl.value_clip,
        )
        return output.per_token, {"loss": output.loss.detach(), "clip_fraction": output.clip_fraction}

    def _train_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return {
            "train/value_loss": metrics["loss"],
            "train/value_clip_fraction": metrics["clip_fraction"],
            "train/critic_grad_norm": metrics["grad_norm"],
        }
