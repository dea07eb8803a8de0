"""S-RM-1 end to end on CPU: configs/ppo_tiny_rlhf_cpu.py as shipped (its tiny reward model
built and trained here, 40 iterations), the policy trained on the reward model's scores
alone: held-out success by the hidden copy rule (val/exact_match, greedy on every digit)
rises by at least 0.3 from before training to the end, and every row carries the model's
score beside the rule's verdict.

Slow (the reward model's training and a whole run): `pytest -m slow tests/in_process/test_rlhf_learning.py`."""

from __future__ import annotations

import json

import pytest

from configs.loading import load_config
from flows.in_process import run_in_process
from rundir.run_outputs import RunPaths
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def test_the_policy_learns_the_hidden_rule_from_the_reward_model_alone(tiny_model_dir, tmp_path):
    config = load_config(REPO_ROOT / "configs" / "ppo_tiny_rlhf_cpu.py", [
        f"job.output_root={tmp_path}", f"model.path={tiny_model_dir}",
        f"rl.reward.model.path={tmp_path / 'reward-model'}", "job.trackers=[]",
    ])
    run_in_process(config, paths=RunPaths.for_config(config))
    report = json.loads((tmp_path / "reward-model" / "tiny_reward_training.json").read_text())
    assert report["pair_accuracy"] == 1.0
    rows = [json.loads(line) for line in open(tmp_path / config.job.name / "metrics.jsonl")]
    evaluated = [row["val/exact_match"] for row in rows if "val/exact_match" in row]
    assert rows[0]["iteration"] == 0 and evaluated[-1] - evaluated[0] >= 0.3, evaluated
    trained = [row for row in rows if row["iteration"] >= 1]
    assert all("reward/model_raw_mean" in row and "reward/fraction_correct" in row for row in trained)
