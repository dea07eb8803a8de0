"""The engine-mismatch correction `rl.rollout.engine_mismatch_cap` (S-OPT-1) on the real
role bodies: the tiny profile trains with it and reports its metrics, and targets built
from a trajectory whose engine log-probs are perturbed by hand carry the truncated
weights into the loss the policy trains with.

On the CPU engine (transformers `generate`) the engine's sampling log-probs and the
trainer's recomputed ones agree (`rollout/logprob_abs_diff` is 0 on the tiny profile's
one-token answers; docs/reference/ppo-options.md records a longer profile), so there the
weights are 1 and nothing is truncated; the perturbation is what exercises the cap.
The vLLM engine, whose gap the option is for, has not been run here (no GPU)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from algorithm.ppo_math import masked_mean
from algorithm.update_plan import MicroBatch
from configs.loading import load_config
from flows.in_process import run_in_process
from tests.conftest import TINY_PROFILE


def test_the_tiny_profile_trains_with_the_correction(tiny_overrides):
    config = load_config(TINY_PROFILE, tiny_overrides + ["rl.max_steps=2", "rl.rollout.engine_mismatch_cap=2"])
    records, roles = run_in_process(config)
    for record in records:
        assert record["rollout/logprob_abs_diff"] < 1e-5  # the CPU engine agrees with the trainer
        assert record["train/engine_mismatch_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert record["train/engine_mismatch_truncated_fraction"] == 0.0
        assert math.isfinite(record["train/policy_loss"])
    assert roles.policy.policy_version == 2

    # The next batch, its engine log-probs moved by hand: log 4 lower on every other sampled
    # token (π_old/π_engine = 4, truncated to 2), log 2 higher on the rest (0.5).
    trajectory = _scored_trajectory(roles, iteration=3, batch_size=config.rl.batch_size)
    mask = trajectory.action_mask
    every_other = (torch.cumsum(mask, dim=1) % 2 == 1).float() * mask
    shift = (every_other * -math.log(4.0) + (mask - every_other) * math.log(2.0))
    perturbed = dataclasses.replace(trajectory, rollout_logprobs=trajectory.rollout_logprobs + shift)
    targets, metrics = roles.policy.prepare_batch(perturbed)

    ratio = torch.exp(targets.old_logprobs - perturbed.rollout_logprobs) * mask  # ≈ 4 or 0.5 on real tokens
    expected = torch.clamp(ratio, max=2.0) * mask
    assert torch.equal(targets.behaviour_weights, expected)
    torch.testing.assert_close(targets.behaviour_weights[every_other.bool()], torch.full_like(
        targets.behaviour_weights[every_other.bool()], 2.0))
    torch.testing.assert_close(targets.behaviour_weights[(mask - every_other).bool()], torch.full_like(
        targets.behaviour_weights[(mask - every_other).bool()], 0.5), rtol=1e-5, atol=1e-5)
    assert metrics["train/engine_mismatch_truncated_fraction"] == pytest.approx(
        float(every_other.sum() / mask.sum()), abs=1e-6)
    assert metrics["train/engine_mismatch_weight_mean"] == pytest.approx(float(masked_mean(expected, mask)), abs=1e-6)

    # The loss the policy trains with carries the weights: at the frozen targets the ratio
    # is 1, so each token's loss is the unweighted one times its weight.
    everything = MicroBatch(torch.arange(targets.input_ids.shape[0]))
    with torch.no_grad():
        weighted, _ = roles.policy._loss(targets, everything)
        plain, _ = roles.policy._loss(dataclasses.replace(targets, behaviour_weights=None), everything)
    torch.testing.assert_close(weighted, plain * everything.response(targets.behaviour_weights))
    assert not torch.isclose(masked_mean(weighted, targets.response_mask), masked_mean(plain, targets.response_mask))


def _scored_trajectory(roles, iteration: int, batch_size: int):
    """One iteration's chain up to (not including) policy.prepare_batch."""
    prompts, _ = roles.data.next_batch(iteration, batch_size)
    trajectory, _ = roles.rollout.generate(prompts, roles.policy.policy_version)
    trajectory, _ = roles.reward.score(trajectory)
    trajectory, _, _ = roles.replay.add(trajectory)
    trajectory, _ = roles.reference.score(trajectory)
    trajectory, _ = roles.critic.predict(trajectory)
    return trajectory
