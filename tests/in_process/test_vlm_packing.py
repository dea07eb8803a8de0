"""Vision-language prompts through the roles in-process (S-RUN-6, S-DATA-2): rows
reach the DataPacker unchanged, a configured packer factory is the one used, a
missing image names its row and path, and reference, critic and policy see the
pixels the rollout showed the model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from configs.loading import load_config
from configs.schema import TinyModelSpec, TinyVisionSpec
from data.packer_media import PromptMediaError
from data.packing import MULTIMODAL_EXTRA
from data.packer_choice import build_packer
from models.model_io import response_logprobs
from models.tiny_vlm import build_tiny_vlm
from roles.critic_role import CriticRole
from roles.data_role import DataRole
from roles.policy_role import PolicyRole
from roles.reference_role import ReferenceRole
from roles.rollout_role import RolloutRole
from tests.conftest import REPO_ROOT, first_rank
from tests.support.vlm_rows import mixed_rows, write_rows

VLM_PROFILE = str(REPO_ROOT / "tests" / "support" / "profiles" / "vlm_trusting_tests.py")  # names tests/ callables


class RecordingPacker:
    """A custom packer: records what it is given, packs with the built-in one."""

    def __init__(self, model_path: str, tag: str):
        self.tag = tag
        self.inner = build_packer(model_path)
        self.seen: list[list] = []

    def pack_prompts(self, prompts, sources=None):
        self.seen.append(list(prompts))
        return self.inner.pack_prompts(prompts, sources)

    def decode_completions(self, response_ids, response_mask):
        return self.inner.decode_completions(response_ids, response_mask)


def recording_packer(model_path: str, tag: str = "unset") -> RecordingPacker:
    return RecordingPacker(model_path, tag)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> str:
    return str(build_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm", TinyModelSpec(vision=TinyVisionSpec())))


def _config(vlm_dir, data_file, *extra):
    return load_config(VLM_PROFILE, [f"model.path={vlm_dir}", f"rl.data.path={data_file}", "rl.data.shuffle=false",
                                     *extra])


def test_rows_reach_a_configured_packer_unchanged(vlm_dir, tmp_path):
    rows = mixed_rows(tmp_path / "media")
    data_file = write_rows(tmp_path / "rows.jsonl", rows)
    config = _config(vlm_dir, data_file, "data_packer.factory=tests.in_process.test_vlm_packing:recording_packer",
                     'data_packer.factory_kwargs={"tag": "t1"}')
    data = DataRole(config)
    batch, _ = data.next_batch(1, len(rows))
    rollout = RolloutRole(config, first_rank(config, "rollout"))
    assert isinstance(rollout.packer, RecordingPacker) and rollout.packer.tag == "t1"
    trajectory, _ = rollout.generate(batch, 0)
    (seen,) = rollout.packer.seen
    # The very objects the data role holds, equal to the file's rows: no key was
    # added (no null-filled `image` on text parts), none removed (S-DATA-2, S-DATA-5).
    assert all(given is held.prompt for given, held in zip(seen, data.rows))
    assert seen == [json.loads(line)["prompt"] for line in data_file.read_text().splitlines()]
    per_sample = trajectory.extras[MULTIMODAL_EXTRA].per_sample
    assert [sorted(s) for s in per_sample[:3]] == [[], [], ["image_grid_thw", "pixel_values"]]
    assert all("pixel_values_videos" in s for s in per_sample[5:])


def test_missing_image_file_names_the_row_position_and_the_path(vlm_dir, tmp_path):
    rows = mixed_rows(tmp_path / "media")
    missing = tmp_path / "media" / "gone.png"
    rows[3]["prompt"][0]["content"][0]["image"] = str(missing)
    data_file = write_rows(tmp_path / "rows.jsonl", rows)
    config = _config(vlm_dir, data_file)
    batch, _ = DataRole(config).next_batch(1, len(rows))
    with pytest.raises(PromptMediaError) as caught:
        RolloutRole(config, first_rank(config, "rollout")).generate(batch, 0)
    assert str(caught.value) == (
        f"{data_file} row 3 (line 4, column 1): `prompt[0].content[0].image` names image file '{missing}', "
        "which does not exist"
    )


def test_reference_critic_and_policy_score_with_the_rollout_pixels(vlm_dir, tmp_path):
    rows = mixed_rows(tmp_path / "media")
    config = _config(vlm_dir, write_rows(tmp_path / "rows.jsonl", rows), "rl.rollout.max_new_tokens=6")
    batch, _ = DataRole(config).next_batch(1, len(rows))
    rollout = RolloutRole(config, first_rank(config, "rollout"))
    trajectory, _ = rollout.generate(batch, 0)
    never = set(trajectory.extras[MULTIMODAL_EXTRA].never_generate)
    assert not never & set(trajectory.response_ids[trajectory.response_mask.bool()].tolist())

    trajectory, _ = ReferenceRole(config, first_rank(config, "reference")).score(trajectory)
    critic = CriticRole(config, first_rank(config, "critic"))
    trajectory, _ = critic.predict(trajectory)
    trajectory = dataclasses.replace(trajectory, batch_id="vlm-batch", sequence_scores=torch.zeros(len(rows)))
    policy = PolicyRole(config, first_rank(config, "policy"))
    targets, metrics = policy.prepare_batch(trajectory)
    # The trainer's recomputation matches what the engine sampled with (measured
    # 6.5e-8), and the frozen reference (same weights at version 0) agrees exactly.
    assert metrics["rollout/logprob_abs_diff"] < 1e-5
    assert metrics["train/kl"] == 0.0
    assert targets.extras is trajectory.extras

    # Without the pixels the image and video rows score differently: the numbers
    # above could not have come from a text-only forward.
    input_ids, attention_mask = trajectory.sequences()
    multimodal = trajectory.extras[MULTIMODAL_EXTRA]
    no_pixels = {MULTIMODAL_EXTRA: dataclasses.replace(multimodal, per_sample=tuple({} for _ in multimodal.per_sample))}
    blind = response_logprobs(policy.model, input_ids, attention_mask, trajectory.prompt_length, 1.0, no_pixels)
    seeing = response_logprobs(
        policy.model, input_ids, attention_mask, trajectory.prompt_length, 1.0, trajectory.extras
    )
    difference = ((blind - seeing).abs() * trajectory.response_mask).sum(dim=1)
    assert torch.all(difference[2:] > 1e-4) and torch.all(difference[:2] < 1e-6)


def test_vlm_minibatches_train_policy_and_critic(vlm_dir, tmp_path):
    from algorithm.ppo_math import last_action_scores
    from algorithm.update_plan import UpdatePlan

    rows = mixed_rows(tmp_path / "media")
    config = _config(vlm_dir, write_rows(tmp_path / "rows.jsonl", rows), "rl.rollout.max_new_tokens=3")
    batch, _ = DataRole(config).next_batch(1, len(rows))
    trajectory, _ = RolloutRole(config, first_rank(config, "rollout")).generate(batch, 0)
    trajectory, _ = ReferenceRole(config, first_rank(config, "reference")).score(trajectory)
    critic = CriticRole(config, first_rank(config, "critic"))
    trajectory, _ = critic.predict(trajectory)
    scores = torch.arange(len(rows)) % 2 * 1.0
    trajectory = dataclasses.replace(
        trajectory, batch_id="b", sequence_scores=scores,
        token_scores=last_action_scores(scores, trajectory.action_mask),
    )
    policy = PolicyRole(config, first_rank(config, "policy"))
    targets, _ = policy.prepare_batch(trajectory)
    critic.install_targets(targets)
    plan = UpdatePlan(epochs=1, minibatch_size=4, micro_batch_size=2, seed=0, outer_iteration=1)
    before = {k: v.clone() for k, v in policy.model.state_dict().items() if "visual" in k}
    policy_receipt = policy.train_batch(plan, "b")
    critic_receipt = critic.train_batch(plan, "b")
    assert policy_receipt.optimizer_step == critic_receipt.optimizer_step == 2
    # The vision tower is trained too: its gradients came through the pixels.
    after = policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # S-PATH-3 on pixels: token-budget micro-batches keep the whole prompt (the token types
    # are aligned with it) and trim only the response columns.
    longest = int(targets.attention_mask.sum(dim=1).max())
    by_tokens = dataclasses.replace(plan, outer_iteration=2, micro_batch_tokens=longest)
    policy_receipt = policy.train_batch(by_tokens, "b")
    assert critic.train_batch(by_tokens, "b").optimizer_step == policy_receipt.optimizer_step == 4
    assert 0.0 <= policy_receipt.metrics["perf/padding_fraction"] < 1.0


def test_an_engine_without_multimodal_support_refuses_naming_the_key(vlm_dir, tmp_path):
    from roles.rollout.hf_engine import HFEngine

    class TextOnlyEngine(HFEngine):  # stands in for the vLLM engine, which does not run here
        accepts_multimodal = False

    rows = mixed_rows(tmp_path / "media")
    config = _config(vlm_dir, write_rows(tmp_path / "rows.jsonl", rows))
    batch, _ = DataRole(config).next_batch(1, 2)
    rollout = RolloutRole(config, first_rank(config, "rollout"))
    rollout.engine = TextOnlyEngine(vlm_dir, "float32", rollout.tokenizer.eos_token_id, rollout.tokenizer.pad_token_id)
    with pytest.raises(NotImplementedError, match=r"rl.rollout.engine='hf' does not take the multimodal inputs"):
        rollout.generate(batch, 0)
