"""The advantage estimators of `rl.advantage_estimator` (S-OPT-2) against numbers worked
by hand in float64 (the arithmetic is in the comments) and against their peers'
definitions, written out here independently as per-row loops over the groups."""

from __future__ import annotations

import statistics

import pytest
import torch

from algorithm.advantage_estimators import ADVANTAGE_ESTIMATORS, EstimatorInputs, advantage_estimator
from algorithm.ppo_math import generalized_advantage_estimate, whiten
from configs.loading import load_config
from placement.plan import plan_placement
from rundir.preflight_checks import check_manifest
from tests.conftest import TINY_PROFILE
from tests.pure.test_ppo_options import assert_refused_naming

F64 = torch.float64


def _inputs(rewards, mask, groups, values=None, gamma=1.0, grpo_scale=True) -> EstimatorInputs:
    return EstimatorInputs(
        torch.tensor(rewards, dtype=F64), None if values is None else torch.tensor(values, dtype=F64),
        torch.tensor(mask, dtype=F64), torch.tensor(groups), gamma, 0.95, grpo_scale,
    )


# Two prompts, two samples each; each row's outcome sits on its last sampled token.
# Row outcomes: 1, 0 (group 0) and 0.5, 0.5 (group 1).
REWARDS = [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.5], [0.5, 0.0, 0.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
GROUPS = [0, 0, 1, 1]


def test_grpo_by_hand():
    advantages, returns = advantage_estimator("grpo").compute(_inputs(REWARDS, MASK, GROUPS))
    # group 0: mean 0.5, std (Bessel) sqrt(((0.5)^2 + (0.5)^2) / 1) = 0.7071: ±0.5/0.7071 = ±0.70711
    # group 1: equal outcomes: 0 / (0 + 1e-6) = 0
    expected = torch.tensor([[0.70710578, 0.70710578, 0.0], [-0.70710578] * 3, [0.0] * 3, [0.0] * 3], dtype=F64)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-7)
    assert returns is advantages or torch.equal(returns, advantages)


def test_grpo_unscaled_is_the_centred_outcome():
    advantages, _ = advantage_estimator("grpo").compute(_inputs(REWARDS, MASK, GROUPS, grpo_scale=False))
    # Dr. GRPO: 1 − 0.5, 0 − 0.5, 0.5 − 0.5, 0.5 − 0.5 on every sampled token
    expected = torch.tensor([[0.5, 0.5, 0.0], [-0.5] * 3, [0.0] * 3, [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-12)


def test_rloo_by_hand_and_a_lonely_sample_is_refused():
    advantages, _ = advantage_estimator("rloo").compute(_inputs(REWARDS, MASK, GROUPS))
    # row 0: 1 − 0 = 1; row 1: 0 − 1 = −1; rows 2, 3: 0.5 − 0.5 = 0
    expected = torch.tensor([[1.0, 1.0, 0.0], [-1.0] * 3, [0.0] * 3, [0.0] * 3], dtype=F64)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="two or more"):
        advantage_estimator("rloo").compute(_inputs(REWARDS, MASK, [0, 0, 1, 2]))


def test_reinforce_plus_plus_by_hand_skips_observations():
    # One episode: action, observation, action; rewards 1 on the first action, 2 on the last.
    inputs = _inputs([[1.0, 0.0, 2.0]], [[1.0, 0.0, 1.0]], [0], gamma=0.5)
    returns, _ = advantage_estimator("reinforce_plus_plus").compute(inputs)
    # G_2 = 2; the observation keeps no return of its own; G_0 = 1 + 0.5 · 2 = 2
    torch.testing.assert_close(returns, torch.tensor([[2.0, 0.0, 2.0]], dtype=F64), rtol=0, atol=1e-12)


def _verl_group_scores(rewards: torch.Tensor, groups: list[int], scale: bool) -> list[float]:
    """verl's `compute_grpo_outcome_advantage` and OpenRLHF's group_norm: a dict from
    group to its scores; a group of one keeps its score (mean 0, std 1)."""
    scores = rewards.sum(dim=1).tolist()
    by_group: dict[int, list[float]] = {}
    for group, score in zip(groups, scores):
        by_group.setdefault(group, []).append(score)
    out = []
    for group, score in zip(groups, scores):
        members = by_group[group]
        mean, std = (statistics.fmean(members), statistics.stdev(members)) if len(members) > 1 else (0.0, 1.0)
        out.append((score - mean) / (std + 1e-6) if scale else score - mean)
    return out


def _verl_rloo(rewards: torch.Tensor, groups: list[int]) -> list[float]:
    scores = rewards.sum(dim=1).tolist()
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for group, score in zip(groups, scores):
        sums[group] = sums.get(group, 0.0) + score
        counts[group] = counts.get(group, 0) + 1
    return [score - (sums[g] - score) / (counts[g] - 1) for g, score in zip(groups, scores)]


def _verl_reinforce_plus_plus(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """verl's recursion, which resets the running return on padding (a prefix mask)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return whiten(returns, mask)


@pytest.mark.parametrize("seed", range(20))
def test_the_estimators_match_the_peers_definitions(seed):
    generator = torch.Generator().manual_seed(seed)
    rows, length, per_group = 12, 7, 3
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    mask = (torch.arange(length) < lengths.unsqueeze(1)).to(F64)  # single-turn: a prefix
    rewards = torch.randn(rows, length, generator=generator, dtype=F64) * mask
    groups = [row // per_group for row in range(rows)]
    inputs = EstimatorInputs(rewards, None, mask, torch.tensor(groups), 0.9, 0.95, True)
    for scale in (True, False):
        got, _ = advantage_estimator("grpo").compute(EstimatorInputs(**{**inputs.__dict__, "grpo_scale": scale}))
        want = torch.tensor(_verl_group_scores(rewards, groups, scale), dtype=F64).unsqueeze(1) * mask
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got, _ = advantage_estimator("rloo").compute(inputs)
    torch.testing.assert_close(got, torch.tensor(_verl_rloo(rewards, groups), dtype=F64).unsqueeze(1) * mask,
                               rtol=1e-12, atol=1e-12)
    returns, _ = advantage_estimator("reinforce_plus_plus").compute(inputs)
    torch.testing.assert_close(whiten(returns, mask), _verl_reinforce_plus_plus(rewards, mask, 0.9),
                               rtol=1e-10, atol=1e-10)
    values = torch.randn(rows, length, generator=generator, dtype=F64)
    gae = advantage_estimator("gae").compute(EstimatorInputs(**{**inputs.__dict__, "values": values}))
    for got_part, want_part in zip(gae, generalized_advantage_estimate(rewards, values, mask, 0.9, 0.95)):
        assert torch.equal(got_part, want_part)  # the registry's gae is the one GAE, bit for bit


def test_the_registry_says_who_needs_a_critic_and_groups():
    traits = {name: (e.uses_critic, e.uses_groups, e.whitens) for name, e in ADVANTAGE_ESTIMATORS.items()}
    assert traits == {
        "gae": (True, False, True), "grpo": (False, True, False), "rloo": (False, True, False),
        "reinforce_plus_plus": (False, False, True),
    }


# --- the config and the plan ----------------------------------------------------------


@pytest.mark.parametrize("overrides, named", [
    (["rl.advantage_estimator=grpo"], ["rl.advantage_estimator=grpo", "rl.rollout.samples_per_prompt is 1"]),
    (["rl.advantage_estimator=rloo"], ["rl.advantage_estimator=rloo", "rl.rollout.samples_per_prompt is 1"]),
    (["rl.advantage_estimator=ppo"], ["rl.advantage_estimator", "'ppo'", "gae, grpo, rloo, reinforce_plus_plus"]),
    (["rl.advantage_estimator=reinforce_plus_plus", "rl.critic_warmup_iterations=2"],
     ["rl.advantage_estimator=reinforce_plus_plus", "rl.critic_warmup_iterations is 2"]),
    (["rl.advantage_estimator=reinforce_plus_plus", "model.critic_path=/somewhere"],
     ["model.critic_path", "rl.advantage_estimator=reinforce_plus_plus"]),
    (["rl.advantage_estimator=reinforce_plus_plus", "grid.critic_gpus=1"],
     ["grid.critic_gpus is 1", "rl.advantage_estimator=reinforce_plus_plus"]),
    (["rl.grpo_scale=false"], ["rl.grpo_scale", "rl.advantage_estimator=gae"]),
])
def test_contradictions_are_refused_naming_both_keys(overrides, named):
    assert_refused_naming(overrides, named)


def test_a_critic_free_plan_places_no_critic_and_the_manifest_says_so():
    config = load_config(TINY_PROFILE, ["rl.advantage_estimator=reinforce_plus_plus"])
    plan = plan_placement(config)
    assert plan.trainer_roles == ("policy",) and "critic" not in plan.device_roles
    assert "critic" not in plan.describe()
    summary = "\n".join(check_manifest(config).summary)
    assert "advantages: reinforce_plus_plus (rl.advantage_estimator; no critic" in summary, summary
    grouped = load_config(TINY_PROFILE, ["rl.advantage_estimator=grpo", "rl.rollout.samples_per_prompt=4",
                                         "rl.grpo_scale=false"])
    assert "advantages: grpo (rl.advantage_estimator, not divided by (rl.grpo_scale=false) the group's std, groups " \
        "of 4 samples per prompt; no critic" in "\n".join(check_manifest(grouped).summary)
    default = plan_placement(load_config(TINY_PROFILE, []))
    assert default.trainer_roles == ("policy", "critic") and "critic" in default.describe()
