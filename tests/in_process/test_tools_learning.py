"""The tiny agent profile end to end on CPU (S-ENV-1, S-ENV-2):
configs/ppo_tiny_tools_cpu.py as shipped (its tiny model built and pre-trained here on
training keys only), ten iterations of PPO over episodes:
greedy success on held-out keys and values rises by at least 0.3 from before training, and
it rises because the policy calls the `get` tool (the value is nowhere else).

Measured here: 0.242 before training, 0.906 after 10 iterations (docs/howto/environments.md,
"The tiny agent profile"). The margin is under half that rise, so CPU numerics elsewhere do
not make it flaky, while a policy that never learns to call the tool stays near +0.0.

Slow (a 2-minute pre-training and ten iterations): `pytest -m slow tests/in_process/test_tools_learning.py`."""

from __future__ import annotations

import json

import pytest

from configs.loading import load_config
from flows.in_process import run_in_process
from rundir.run_outputs import RunPaths
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def test_held_out_success_rises_by_calling_the_tool(tmp_path):
    config = load_config(REPO_ROOT / "configs" / "ppo_tiny_tools_cpu.py", [
        f"job.output_root={tmp_path}", f"model.path={tmp_path / 'tools-model'}", "job.trackers=[]",
        "rl.max_steps=10",
    ])
    run_in_process(config, paths=RunPaths.for_config(config))
    rows = [json.loads(line) for line in open(tmp_path / config.job.name / "metrics.jsonl")]
    evaluated = [row for row in rows if "val/fraction_correct" in row]
    assert [row["iteration"] for row in evaluated] == [0, 10]
    before, after = evaluated
    assert after["val/fraction_correct"] - before["val/fraction_correct"] >= 0.3, (before, after)
    # Before training greedy episodes call the tool only when told to look up; after, for every question.
    assert before["val/tool_calls_mean"] < 0.5 <= after["val/tool_calls_mean"], (before, after)
