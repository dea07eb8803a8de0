"""The reward role: PPO's terminal reward and the optional per-token shaping term
(S-REW), added to the trajectory as its own fields."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from algorithm.rewards import RewardContext, on_ppo_scale, process_reward, resolve_terminal, terminal_score
from configs.schema import PPOConfig
from contracts.trajectory import Trajectory


class RewardRole:
    def __init__(self, config: PPOConfig):
        self.reward = config.rl.reward
        self.matcher = resolve_terminal(
            self.reward.terminal, self.reward.terminal_callable, config.job.trusted_modules
        )

    def ready(self) -> dict[str, Any]:
        return {"role": "reward", "terminal": self.matcher.name if self.matcher else "none"}

    def score(self, trajectory: Trajectory) -> tuple[Trajectory, dict[str, float]]:
        batch = trajectory.prompts
        scores, correct = [], []
        for prompt, completion, reference, metadata in zip(
            batch.prompts, trajectory.completions, batch.references, batch.metadata
        ):
            context = RewardContext(prompt=prompt, completion=completion, reference=reference, metadata=metadata)
            score = terminal_score(self.matcher, context)  # the user's callable runs once per completion
            scores.append(on_ppo_scale(
                score, correct_reward=self.reward.correct_reward, incorrect_reward=self.reward.incorrect_reward
            ))
            # The matcher's verdict, not a reward comparison: equal correct and incorrect
            # rewards must not make every sample "correct"; a partial score is not correct.
            correct.append(1.0 if score == 1.0 else 0.0)
        score_tensor = torch.tensor(scores, dtype=torch.float32)
        process = process_reward(self.reward.process, trajectory.response_mask)
        scored = dataclasses.replace(
            trajectory,
            scores=score_tensor,
            process_rewards=process,
            correct=torch.tensor(correct, dtype=torch.float32) if self.matcher is not None else None,
        )
        process_per_sequence = process.sum(dim=1)
        metrics = {
            "train/reward_mean": float(score_tensor.mean()),
            "reward/terminal_mean": float(score_tensor.mean()),
            "reward/process_mean": float(process_per_sequence.mean()),
        }
        if self.matcher is not None:  # terminal "none" gives no verdict, so no fraction to report
            metrics["reward/fraction_correct"] = float(sum(correct) / len(correct))
        return scored, metrics

    def score_validation(self, trajectory: Trajectory) -> dict[str, float]:
        """The run's own reward on evaluation completions, as `val/*` metrics (S-OPS-2).
        `val/exact_match` compares the stripped completion with the stripped reference,
        whatever the reward rule; `val/fraction_correct` is the rule's verdict."""
        scored, metrics = self.score(trajectory)
        result = {"val/reward_mean": metrics["train/reward_mean"]}
        if "reward/fraction_correct" in metrics:
            result["val/fraction_correct"] = metrics["reward/fraction_correct"]
        references = trajectory.prompts.references
        if references and all(reference is not None for reference in references):
            hits = [c.strip() == str(r).strip() for c, r in zip(trajectory.completions, references)]
            result["val/exact_match"] = sum(hits) / len(hits)
        return result
