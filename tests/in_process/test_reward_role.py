"""The reward role's report of correctness: counted by the terminal matcher's
verdict (issue 15), not by comparing reward floats."""

from __future__ import annotations

import pytest
import torch

from configs.loading import load_config
from roles.reward_role import RewardRole
from contracts.trajectory import PromptBatch, Trajectory
from tests.conftest import TINY_PROFILE


def _generated(completions: list[str], references: list[str]) -> Trajectory:
    b = len(completions)
    prompts = PromptBatch(1, ["2+2="] * b, references, [{}] * b, list(range(b)), [f"row {i}" for i in range(b)])
    return Trajectory.one_turn(
        iteration=1,
        policy_version=0,
        prompts=prompts,
        prompt_ids=torch.ones(b, 2, dtype=torch.long),
        prompt_mask=torch.ones(b, 2, dtype=torch.long),
        response_ids=torch.ones(b, 3, dtype=torch.long),
        response_mask=torch.ones(b, 3),
        rollout_logprobs=torch.zeros(b, 3),
        completions=completions,
    )


def _score(overrides: list[str], completions: list[str], references: list[str]) -> tuple[Trajectory, dict[str, float]]:
    return RewardRole(load_config(TINY_PROFILE, overrides)).score(_generated(completions, references))


def test_equal_rewards_still_count_only_matched_completions_as_correct():
    # One right ("4" for 4), one wrong ("5" for 4): both earn 0.5, but only one is correct.
    scored, metrics = _score(
        ["rl.reward.terminal=arithmetic_exact_match", "rl.reward.correct_reward=0.5", "rl.reward.incorrect_reward=0.5"],
        ["4", "5"], ["4", "4"],
    )
    assert scored.sequence_scores.tolist() == [0.5, 0.5]
    assert metrics["reward/fraction_correct"] == 0.5  # the float comparison said 1.0
    assert scored.correct.tolist() == [1.0, 0.0]


def test_fraction_correct_follows_the_matcher_with_distinct_rewards():
    # Three of four match: 0.75, whatever the rewards are worth.
    _, metrics = _score(
        [
            "rl.reward.terminal=arithmetic_exact_match",
            "rl.reward.correct_reward=2.0",
            "rl.reward.incorrect_reward=-1.0",
        ],
        ["4", "4", "x", "7"],
        ["4", "4", "4", "7"],
    )
    assert metrics["reward/fraction_correct"] == pytest.approx(0.75)
    assert metrics["reward/terminal_mean"] == pytest.approx((2.0 + 2.0 - 1.0 + 2.0) / 4)


def test_terminal_none_reports_no_fraction_correct():
    # No matcher, no verdict: the key is absent rather than a misleading 0.0.
    scored, metrics = _score(["rl.reward.terminal=none"], ["4", "5"], ["4", "4"])
    assert "reward/fraction_correct" not in metrics
    assert scored.correct is None
    assert metrics["reward/terminal_mean"] == 0.0
