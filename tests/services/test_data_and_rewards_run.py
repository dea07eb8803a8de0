"""A CPU run on a conversation-shaped JSONL file with a shared reward rule
(S-DATA-2/3, S-REW-1): rows reach the model untouched, rewards come from the text."""

from __future__ import annotations

import json

import pytest

from configs.loading import load_config
from data.packing import UnsupportedPromptError
from roles.data_role import DataRole
from roles.rollout_role import RolloutRole
from tests.conftest import TINY_PROFILE, first_rank
from tests.support.helpers import metric_records


def _conversation_file(path) -> str:
    rows = []
    for i in range(32):
        digit = str(i % 10)
        content = digit if i % 2 else [{"type": "text", "text": digit}]
        rows.append({"prompt": [{"role": "user", "content": content}], "reference": digit})
    rows.append({"prompt": [{"role": "user", "content": [{"type": "image", "image": "cat.png"},
                                                        {"type": "text", "text": "7"}]}], "reference": "7"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_conversation_jsonl_with_arithmetic_reward_trains_two_iterations(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    from flows.training import ppo

    data_file = _conversation_file(tmp_path / "chats.jsonl")
    ppo(profile=TINY_PROFILE, run_name="chats",
        overrides=tiny_overrides + [f"rl.data.path={data_file}", "rl.data.shuffle=false", "rl.max_steps=2",
                                    "rl.reward.terminal=arithmetic"])
    records = metric_records(tmp_path / "outputs" / "chats")
    assert [r["iteration"] for r in records] == [1, 2]
    assert all(0.0 <= r["reward/fraction_correct"] <= 1.0 and "train/reward_mean" in r for r in records)


def test_image_row_is_refused_by_the_text_packer_naming_the_row(tiny_model_dir, tmp_path):
    data_file = _conversation_file(tmp_path / "chats.jsonl")
    config = load_config(TINY_PROFILE, [f"rl.data.path={data_file}", "rl.data.shuffle=false",
                                        f"model.path={tiny_model_dir}"])
    data = DataRole(config)
    data.next_batch(1, 32)
    batch, _ = data.next_batch(2, 1)
    assert batch.prompts[0][0]["content"][0] == {"type": "image", "image": "cat.png"}  # untouched
    with pytest.raises(
        UnsupportedPromptError, match=r"chats.jsonl row 32 \(line 33, column 1\): prompt\[0\]\.content\[0\]"
    ):
        RolloutRole(config, first_rank(config, "rollout")).generate(batch, 0)
