"""S-RM-1 over Ray actors: the flow with a reward model placed beside the reference (the
host on CPU), its critic started from it, normalised scores kept in the boundary and
continued by a rerun through the reward actor's load.

Slow (two flow runs): `pytest -m slow tests/services/test_reward_model_flow.py`."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TINY_PROFILE
from tests.support.helpers import boundary, metric_records

pytestmark = pytest.mark.slow


def test_a_flow_scored_by_a_reward_model_commits_and_resumes_its_statistics(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tiny_reward_model_dir, tmp_path
):
    from flows.training import ppo

    overrides = tiny_overrides + [
        "rl.reward.terminal=exact_match", f"rl.reward.model.path={tiny_reward_model_dir}",
        "rl.reward.model.max_length=64", "rl.reward.model.normalize=true", "rl.save_every=2",
        f"model.critic_path={tiny_reward_model_dir}",
    ]
    ppo(profile=TINY_PROFILE, run_name="rlhf", overrides=overrides + ["rl.max_steps=2"])
    run_dir = tmp_path / "outputs" / "rlhf"
    moments = json.loads((boundary(run_dir, 2) / "reward" / "reward_moments.json").read_text())
    assert moments["count"] == 2 * 16
    ppo(profile=TINY_PROFILE, run_name="rlhf", overrides=overrides + ["rl.max_steps=3"])
    records = metric_records(run_dir)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    assert all("reward/model_normalized_mean" in r and "reward/fraction_correct" in r for r in records)
    assert json.loads((boundary(run_dir, 3) / "reward" / "reward_moments.json").read_text())["count"] == 3 * 16
