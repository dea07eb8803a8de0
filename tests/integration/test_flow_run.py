"""The walking skeleton, end to end: the `ppo` flow with real Prefect (embedded test
API), real local Ray actors and the tiny HF model."""

import json
from pathlib import Path

import pytest


pytestmark = [pytest.mark.ray, pytest.mark.prefect]


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_iterations_write_metrics_commit_boundaries_and_advance_policy_version(golden_run):
    summary, run_dir = golden_run.summary, golden_run.run_dir
    records = _records(run_dir)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    for record in records:
        for key in ("train/reward_mean", "train/policy_loss", "train/value_loss", "train/kl",
                    "train/policy_clip_fraction", "train/policy_approx_kl", "train/explained_variance",
                    "time/rollout_seconds", "time/train_seconds"):
            assert key in record, key
    # The rollout sampled iteration k+1 with the weights published after iteration k.
    assert [r["rollout/policy_version"] for r in records] == [0.0, 1.0, 2.0]
    assert records[1]["train/policy_version"] == 2.0 and summary["policy_version"] == 3

    checkpoints = run_dir / "checkpoints"
    # Iteration 2 commits on the cadence (rl.save_every=2), iteration 3 because the run ends there.
    assert (checkpoints / "latest_checkpoint.txt").read_text().strip() == "iter_000003"
    marker = json.loads((checkpoints / "iter_000002" / "_SUCCESS").read_text())
    assert marker["iteration"] == 2 and marker["role_steps"] == {"policy": 4, "critic": 4}
    boundary = checkpoints / "iter_000003"
    for role_file in (
        "policy/model.safetensors",
        "policy/optimizer.pt",
        "critic/model.safetensors",
        "data/cursor.json",
    ):
        assert (boundary / role_file).is_file(), role_file
