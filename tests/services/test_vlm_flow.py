"""Two PPO iterations of the tiny Qwen2.5-VL through the real `ppo` flow (Ray actors,
Prefect tasks) on a JSONL file mixing text-only, image and video prompts (S-RUN-6)."""

from __future__ import annotations

from pathlib import Path


from configs.schema import TinyModelSpec, TinyVisionSpec
from data.packer_choice import build_packer
from models.tiny_vlm import build_tiny_vlm
from tests.conftest import REPO_ROOT
from tests.support.helpers import metric_records
from tests.support.vlm_rows import mixed_rows, write_rows

VLM_PROFILE = str(REPO_ROOT / "configs" / "ppo_tiny_vlm_cpu.py")


def test_two_ppo_iterations_with_the_tiny_vlm_on_mixed_jsonl(prefect_api, ray_cluster, reused_role_processes, tmp_path):
    from flows.training import ppo

    model_dir = build_tiny_vlm(
        tmp_path / "models" / "tiny-vlm", TinyModelSpec(task_alphabet="0123456789", vision=TinyVisionSpec())
    )
    rows = mixed_rows(tmp_path / "media")
    data_file = write_rows(tmp_path / "rows.jsonl", rows)
    result = ppo(
        profile=VLM_PROFILE,
        run_name="vlm",
        overrides=[
            f"job.output_root={tmp_path / 'outputs'}",
            f"model.path={model_dir}",
            f"rl.data.path={data_file}",
            "rl.data.shuffle=false",
            "rl.max_steps=2",
            f"rl.batch_size={len(rows)}",
            "rl.minibatch_size=4",
            "rl.micro_batch_size=2",
            "rl.epochs=1",
            "rl.rollout.max_new_tokens=2",
            "rl.validation=null",
        ],
    )
    records = metric_records(tmp_path / "outputs" / "vlm")
    assert [r["iteration"] for r in records] == [1, 2]
    for record in records:
        # Rewards are the matcher's verdict on the generated text of every row.
        assert 0.0 <= record["reward/fraction_correct"] <= 1.0 and "train/reward_mean" in record
        # The trainer scored with the pixels the engine sampled with.
        assert record["rollout/logprob_abs_diff"] < 1e-4
    # 8 samples in minibatches of 4: two optimizer steps per iteration for each trainer.
    assert [r["optim/policy_optimizer_step"] for r in records] == [2.0, 4.0]
    assert [r["optim/critic_optimizer_step"] for r in records] == [2.0, 4.0]
    # The final boundary exports as a VLM a DataPacker can load again: weights,
    # tokenizer with its chat template, and image processor.
    exported = Path(result["final_model"]["policy"])
    assert {"config.json", "chat_template.jinja", "preprocessor_config.json"} <= {p.name for p in exported.iterdir()}
    assert build_packer(str(exported)).pack_prompts([rows[2]["prompt"]]).multimodal.has_media
