"""The walking skeleton, end to end: the `ppo` flow with real Prefect (embedded test
API), real local Ray actors and the tiny HF model."""

import json
from pathlib import Path

import pytest

from tests.conftest import TINY_PROFILE

pytestmark = [pytest.mark.ray, pytest.mark.prefect]


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_iterations_write_metrics_commit_a_boundary_and_advance_policy_version(
    prefect_api, ray_cluster, tiny_overrides, tmp_path
):
    from flows.training import ppo

    summary = ppo(profile=TINY_PROFILE, overrides=tiny_overrides + ["rl.max_steps=2", "rl.save_every=2"],
                  run_name="skeleton")
    run_dir = tmp_path / "outputs" / "skeleton"
    records = _records(run_dir)
    assert [r["iteration"] for r in records] == [1, 2]
    for record in records:
        for key in ("train/reward_mean", "train/policy_loss", "train/value_loss", "train/kl",
                    "train/policy_clip_fraction", "train/policy_approx_kl", "train/explained_variance",
                    "time/rollout_seconds", "time/train_seconds"):
            assert key in record, key
    # The rollout sampled iteration 2 with the weights published after iteration 1.
    assert records[0]["rollout/policy_version"] == 0.0 and records[1]["rollout/policy_version"] == 1.0
    assert records[1]["train/policy_version"] == 2.0 and summary["policy_version"] == 2

    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest_checkpoint.txt").read_text().strip() == "iter_000002"
    boundary = checkpoints / "iter_000002"
    marker = json.loads((boundary / "_SUCCESS").read_text())
    assert marker["iteration"] == 2 and marker["role_steps"] == {"policy": 4, "critic": 4}
    for role_file in (
        "policy/model.safetensors",
        "policy/optimizer.pt",
        "critic/model.safetensors",
        "data/cursor.json",
    ):
        assert (boundary / role_file).is_file(), role_file
