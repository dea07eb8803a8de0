"""The reward role: PPO's terminal reward and the optional per-token shaping term
(S-REW), added to the trajectory's per-token scores where they are earned (S-PATH-1). With `rl.reward.model` it also
holds the frozen reward model (S-RM-1), loaded once for the run, and its
normalisation state, which boundaries keep."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from algorithm.reward_errors import LOGGED_ERRORS, describe_reward_error, failed
from algorithm.ppo_math import last_action_scores
from algorithm.rewards import RewardContext, on_ppo_scale, process_reward, resolve_terminal, terminal_score
from configs.code_folders import use_run_code_dirs
from configs.schema import PPOConfig
from contracts.faults import REWARD_EVENTS
from contracts.trajectory import Trajectory
from placement.role_placement import RolePlacement
from roles.reward_model_term import RewardModelTerm


class RewardRole:
    def __init__(self, config: PPOConfig, placement: RolePlacement | None = None):
        """`placement`: where a loaded reward model computes (its own group, or beside
        the reference), or the host's (rules only, or a served model)."""
        use_run_code_dirs()  # S-BYO-3: a reward function beside the profile
        self.reward = config.rl.reward
        # With an environment, its step rewards are the rewards (docs/howto/environments.md):
        # no rule judges the last turn.
        self.matcher = None if config.rl.env is not None else resolve_terminal(
            self.reward.terminal, self.reward.terminal_callable, config.job.trusted_modules
        )
        self.errors_logged = 0
        device = placement.on_visible_device().device if placement is not None else "cpu"
        self.model_term = RewardModelTerm(config, device) if self.reward.model is not None else None

    def ready(self) -> dict[str, Any]:
        ready = {"role": "reward", "terminal": self.matcher.name if self.matcher else "none"}
        if self.model_term is not None:
            ready["model"] = self.model_term.describe()
            ready["device"] = self.model_term.device
        return ready

    def save(self, directory: str) -> dict[str, Any]:
        """The reward model's running normalisation, for a boundary (S-RM-1)."""
        assert self.model_term is not None
        return self.model_term.save(directory)

    def load(self, directory: str) -> dict[str, Any]:
        assert self.model_term is not None
        return self.model_term.load(directory)

    def score(self, trajectory: Trajectory, training: bool = True) -> tuple[Trajectory, dict[str, float]]:
        """Every term lands in `token_scores` where it was earned (S-PATH-1): the
        environment's turn rewards are there from the rollout; the rule's or the
        model's outcome joins them on the last sampled token, shaping on every sampled
        token. `sequence_scores` is the outcome per row (turns summed, shaping left
        out), what the metrics and the experience rows show."""
        outcome, correct, metrics = self._rule_scores(trajectory)
        if self.model_term is not None:
            model_scores, model_metrics = self.model_term.score(trajectory, training=training)
            # The one rule (docs/rewards.md): the model's score alone, or plus the rule's reward.
            outcome = model_scores + outcome if self.reward.model.combine == "sum" else model_scores
            metrics.update(model_metrics)
        process = process_reward(self.reward.process, trajectory.action_mask)
        sequence_scores = trajectory.token_scores.sum(dim=1) + outcome
        token_scores = trajectory.token_scores + last_action_scores(outcome, trajectory.action_mask) + process
        if correct is None:  # no matcher: the environment's verdict, if there is one
            correct = trajectory.correct
        metrics["train/reward_mean"] = metrics["reward/terminal_mean"] = float(sequence_scores.mean())
        metrics["reward/process_mean"] = float(process.sum(dim=1).mean())
        if correct is not None:  # terminal "none" gives no verdict, so no fraction to report
            metrics["reward/fraction_correct"] = float(correct.sum()) / len(correct)
        scored = dataclasses.replace(
            trajectory, token_scores=token_scores, sequence_scores=sequence_scores, correct=correct
        )
        return scored, metrics

    def _rule_scores(self, trajectory: Trajectory) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """The terminal rule's reward on PPO's scale (b,), its verdicts (b,) (None
        without a matcher), and its error metrics."""
        batch = trajectory.prompts
        scores, correct, errors, events = [], [], 0, []
        sources = batch.sources or [None] * len(batch.prompts)
        for prompt, completion, reference, metadata, row_id, source in zip(
            batch.prompts, trajectory.completions, batch.references, batch.metadata, batch.row_ids, sources
        ):
            context = RewardContext(prompt=prompt, completion=completion, reference=reference, metadata=metadata)
            try:
                score = terminal_score(self.matcher, context)  # the user's callable runs once per completion
            except Exception as error:  # S-BYO-3: user code, named with its row and completion
                assert self.matcher is not None  # no matcher, nothing that could raise
                description = describe_reward_error(self.matcher.name, error, row_id, source, completion)
                if self.reward.on_error == "fail":
                    raise failed(description) from error
                errors += 1
                events += self._logged_error(description)
                score = 0.0
            scores.append(on_ppo_scale(
                score, correct_reward=self.reward.correct_reward, incorrect_reward=self.reward.incorrect_reward
            ))
            # The matcher's verdict, not a reward comparison: equal correct and incorrect
            # rewards must not make every sample "correct"; a partial score is not correct.
            correct.append(1.0 if score == 1.0 else 0.0)
        metrics: dict[str, float] = {}
        if self.reward.on_error == "zero":
            metrics["reward/errors"] = float(errors)
        if events:
            metrics[REWARD_EVENTS] = events  # logged by the reward task, not recorded
        verdicts = torch.tensor(correct, dtype=torch.float32) if self.matcher is not None else None
        return torch.tensor(scores, dtype=torch.float32), verdicts, metrics

    def _logged_error(self, description: str) -> list[list[str]]:
        """The first few errors of the run, as events for the stage's log."""
        self.errors_logged += 1
        if self.errors_logged > LOGGED_ERRORS:
            return []
        more = "; later ones are only counted (reward/errors)" if self.errors_logged == LOGGED_ERRORS else ""
        return [["warning", f"{description}; scored as incorrect (rl.reward.on_error=zero){more}"]]

    def score_validation(self, trajectory: Trajectory) -> dict[str, float]:
        """The run's own reward on evaluation completions, as `val/*` metrics (S-OPS-2).
        `val/exact_match` compares the stripped completion with the stripped reference,
        whatever the reward rule; `val/fraction_correct` is the rule's verdict."""
        scored, metrics = self.score(trajectory, training=False)
        result = {"val/reward_mean": metrics["train/reward_mean"]}
        if "reward/model_raw_mean" in metrics:
            result["val/model_raw_mean"] = metrics["reward/model_raw_mean"]
        if REWARD_EVENTS in metrics:
            result[REWARD_EVENTS] = metrics[REWARD_EVENTS]
        if "reward/fraction_correct" in metrics:
            result["val/fraction_correct"] = metrics["reward/fraction_correct"]
        references = trajectory.prompts.references
        if references and all(reference is not None for reference in references):
            hits = [c.strip() == str(r).strip() for c, r in zip(trajectory.completions, references)]
            result["val/exact_match"] = sum(hits) / len(hits)
        return result
