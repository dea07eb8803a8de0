"""PPO must actually learn: a short CPU-profile run on a fixed seed raises the reward.

A run that completes without errors but never improves the policy (a sign flip, a
detached loss, weights that never reach the rollout) passes every structural test;
this one catches it. It drives the role bodies through `flows.in_process` (the same
calls as the flow, without Prefect and Ray start-up) so it stays well under a minute.

Measured on the 2-core reference machine, seed 0: reward 0.075 over iterations 1-5,
0.494 over iterations 16-20 (rise +0.42); docs/performance.md ("The CPU profile") has
the full curves.
The asserted margin is half of that, so CPU-numerics differences between machines
do not make it flaky, while a policy that does not learn stays near +0.0.
"""

from __future__ import annotations

import statistics

import pytest

from tests.conftest import TINY_PROFILE

ITERATIONS = 20
WINDOW = 5
MIN_RISE = 0.2


def _rewards(tiny_model_dir: str, extra: list[str]) -> list[float]:
    from flows.in_process import run_in_process
    from configs.loading import load_config

    config = load_config(
        TINY_PROFILE, [f"model.path={tiny_model_dir}", "job.seed=0", f"rl.max_steps={ITERATIONS}", *extra]
    )
    # The before-training evaluation's row 0 has no training reward.
    return [record["train/reward_mean"] for record in run_in_process(config)[0] if record["iteration"] >= 1]


def _rise(rewards: list[float]) -> float:
    return statistics.fmean(rewards[-WINDOW:]) - statistics.fmean(rewards[:WINDOW])


def test_reward_rises_on_a_fixed_seed(tiny_model_dir):
    rewards = _rewards(tiny_model_dir, [])
    assert len(rewards) == ITERATIONS
    assert _rise(rewards) >= MIN_RISE, f"reward did not rise by {MIN_RISE}: {[round(r, 3) for r in rewards]}"


@pytest.mark.slow
def test_without_actor_updates_the_same_run_does_not_rise(tiny_model_dir):
    """The control: with every iteration critic-only (S-CW-1) the actor never changes,
    so the rise above must come from policy updates, not from the data order."""
    rewards = _rewards(tiny_model_dir, [f"rl.critic_warmup_iterations={ITERATIONS}"])
    assert _rise(rewards) < MIN_RISE / 2, [round(r, 3) for r in rewards]
