"""The reward role: PPO's terminal reward and the optional per-token shaping term
(S-REW), added to the trajectory as its own fields."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from algorithm.rewards import RewardContext, process_reward, resolve_terminal, terminal_reward
from configs.schema import PPOConfig
from roles.trajectory import Trajectory


class RewardRole:
    def __init__(self, config: PPOConfig):
        self.reward = config.rl.reward
        self.matcher = resolve_terminal(self.reward.terminal, self.reward.terminal_callable)

    def ready(self) -> dict[str, Any]:
        return {"role": "reward", "terminal": self.matcher.name if self.matcher else "none"}

    def score(self, trajectory: Trajectory) -> tuple[Trajectory, dict[str, float]]:
        batch = trajectory.prompts
        scores, correct = [], []
        for prompt, completion, reference, metadata in zip(
            batch.prompts, trajectory.completions, batch.references, batch.metadata
        ):
            context = RewardContext(prompt=prompt, completion=completion, reference=reference, metadata=metadata)
            value = terminal_reward(
                self.matcher,
                context,
                correct_reward=self.reward.correct_reward,
                incorrect_reward=self.reward.incorrect_reward,
            )
            scores.append(value)
            correct.append(1.0 if value == self.reward.correct_reward and self.matcher is not None else 0.0)
        score_tensor = torch.tensor(scores, dtype=torch.float32)
        process = process_reward(self.reward.process, trajectory.response_mask)
        scored = dataclasses.replace(
            trajectory,
            scores=score_tensor,
            process_rewards=process,
            correct=torch.tensor(correct, dtype=torch.float32),
        )
        process_per_sequence = process.sum(dim=1)
        return scored, {
            "train/reward_mean": float(score_tensor.mean()),
            "reward/terminal_mean": float(score_tensor.mean()),
            "reward/process_mean": float(process_per_sequence.mean()),
            "reward/fraction_correct": float(sum(correct) / len(correct)),
        }
