"""S-RM-1 without a model: the one rule combining a reward model with a rule (refused
where ambiguous, by key), the URL only from the profile, the score shaping by hand,
and the pre-flight's reading of a reward model folder from its files."""

from __future__ import annotations

import json

import pytest
import torch

from algorithm.reward_model_scores import RunningMoments, first_non_finite, shape_model_scores
from configs.loading import ConfigError, load_config
from models.reward_model_folder import reward_model_folder_problems
from configs.schema import RewardModelConfig
from tests.support.helpers import offline_hub_snapshot
from tests.conftest import REPO_ROOT, TINY_PROFILE

RLHF_PROFILE = str(REPO_ROOT / "configs" / "ppo_tiny_rlhf_cpu.py")


def _refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(TINY_PROFILE, list(overrides))
    return "\n".join(caught.value.problems)


def test_ambiguous_combinations_are_refused_naming_the_keys():
    assert "rl.reward.model.combine=sum" in _refusal(
        "rl.reward.model.path=/m", "rl.reward.terminal=none", "rl.reward.model.combine=sum")
    assert "rl.reward.correct_reward has no effect with rl.reward.model.combine=model" in _refusal(
        "rl.reward.model.path=/m", "rl.reward.correct_reward=2.0")
    assert "set rl.reward.model.path (a model folder) or rl.reward.model.url" in _refusal(
        "rl.reward.model={}")
    assert "rl.reward.model.token_env applies to a served model only" in _refusal(
        "rl.reward.model.path=/m", "rl.reward.model.token_env=TOKEN")
    # The accepted shapes: the model alone with a measured rule, or the sum.
    load_config(TINY_PROFILE, ["rl.reward.model.path=/m"])
    load_config(TINY_PROFILE, ["rl.reward.model.path=/m", "rl.reward.model.combine=sum",
                               "rl.reward.correct_reward=2.0"])


def test_the_url_is_set_in_the_profile_only():
    assert _refusal("rl.reward.model.url=http://10.0.0.9:8000").startswith(
        "rl.reward.model.url: set only in the profile")
    profile = load_config(RLHF_PROFILE)
    served = profile.rl.reward.model.model_copy(update={"url": "http://127.0.0.1:8000"})
    from configs.callables import override_trust_problems

    in_profile = profile.model_copy(update={"rl": profile.rl.model_copy(update={
        "reward": profile.rl.reward.model_copy(update={"model": served})})})
    assert override_trust_problems(in_profile, in_profile) == []


def test_running_moments_merge_batches_as_one_pass():
    moments = RunningMoments()
    moments.update(torch.tensor([1.0, 3.0]))
    moments.update(torch.tensor([5.0, 7.0, 9.0]))
    # 1, 3, 5, 7, 9: mean 5, population variance (16 + 4 + 0 + 4 + 16) / 5 = 8
    assert (moments.count, moments.mean, moments.std) == (5, 5.0, pytest.approx(8 ** 0.5))
    assert RunningMoments.from_state(json.loads(json.dumps(moments.state_dict()))) == moments


def test_shaping_normalises_then_clips_then_penalises_then_weights():
    # raw [1, 3]: mean 2, std 1 -> [-1, 1]; clip 0.5 -> [-0.5, 0.5]; the second has no EOS:
    # 0.5 - 2 = -1.5; weight 2 -> [-1, -3]
    shaped = shape_model_scores(torch.tensor([1.0, 3.0]), torch.tensor([True, False]), RunningMoments(),
                                clip=0.5, missing_eos_penalty=2.0, weight=2.0)
    assert shaped.scores.tolist() == [-1.0, -3.0]
    assert shaped.metrics["reward/model_raw_mean"] == 2.0 and shaped.metrics["reward/model_raw_std"] == 1.0
    assert shaped.metrics["reward/model_clipped_fraction"] == 1.0
    assert shaped.metrics["reward/model_penalized_fraction"] == 0.5
    plain = shape_model_scores(torch.tensor([1.0, 3.0]), torch.tensor([True, False]), None,
                               clip=None, missing_eos_penalty=None, weight=1.0)
    assert plain.scores.tolist() == [1.0, 3.0] and "reward/model_normalized_mean" not in plain.metrics
    assert first_non_finite(torch.tensor([0.0, float("inf"), float("nan")])) == 1
    assert first_non_finite(torch.tensor([0.0])) is None


def _folder(tmp_path, architectures, labels=1, positions=128, tokenizer=True):
    folder = tmp_path / "rm"
    folder.mkdir()
    config = {"model_type": "qwen3", "architectures": architectures, "max_position_embeddings": positions,
              "id2label": {str(i): f"LABEL_{i}" for i in range(labels)}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.mark.parametrize("architectures, labels, expected", [
    (["Qwen3ForCausalLM"], 1, "holds a Qwen3ForCausalLM, not a sequence classifier"),
    (["Qwen3ForSequenceClassification"], 2, "a sequence classifier with 2 labels"),
])
def test_the_preflight_reads_what_the_folder_is(tmp_path, architectures, labels, expected):
    folder = _folder(tmp_path, architectures, labels)
    problems, _ = reward_model_folder_problems(RewardModelConfig(path=str(folder), max_length=64))
    assert [key for key, _ in problems] == ["rl.reward.model.path"] and expected in problems[0][1]


def test_the_preflight_refuses_a_max_length_over_the_context(tmp_path):
    folder = _folder(tmp_path, ["Qwen3ForSequenceClassification"], positions=64, tokenizer=False)
    problems, summary = reward_model_folder_problems(RewardModelConfig(path=str(folder), max_length=128))
    assert [key for key, _ in problems] == ["rl.reward.model.path", "rl.reward.model.max_length"]
    assert "no tokenizer files" in problems[0][1] and "over the reward model's context of 64" in problems[1][1]


GPU_PROFILE = str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py")


def test_the_placement_plan_puts_a_loaded_reward_model_beside_the_reference_or_on_its_own():
    from placement.plan import placement_problems, plan_placement
    from placement.role_placement import role_placements

    plain = plan_placement(load_config(GPU_PROFILE))
    # Rules only: no group; like every role in none, a host placement (one rule for all roles).
    assert plain.group_of("reward") is None
    assert [(p.device, p.parks, p.rank, p.ranks) for p in role_placements(plain)["reward"]] == [("cpu", False, 0, 1)]
    beside = plan_placement(load_config(GPU_PROFILE, ["rl.reward.terminal=none", "rl.reward.model.path=/m"]))
    assert beside.describe() == "colocated [policy+rollout: 2 GPUs; reference+reward: 1 GPU; critic: 1 GPU]"
    assert [(p.device, p.rank) for p in role_placements(beside)["reward"]] == [("cuda", 0)]
    own = load_config(GPU_PROFILE, ["rl.reward.terminal=none", "rl.reward.model.path=/m",
                                    "grid.reward_placement=own", "grid.reward_gpus=1"])
    problems = placement_problems(plan_placement(own), own)
    assert [key for key, _ in problems] == ["grid.gpus_per_node"]  # five GPUs asked of four
    assert "grid.reward_gpus=1" in problems[0][1]
    stray = load_config(GPU_PROFILE, ["grid.reward_gpus=1"])
    assert [key for key, _ in placement_problems(plan_placement(stray), stray)][0] == "grid.reward_gpus"
    served = load_config(TINY_PROFILE, ["rl.reward.terminal=none", "rl.reward.model.path=/m"])
    assert plan_placement(served).group_of("reward").roles == ("reference", "reward")  # the host, on CPU


def test_a_hub_reward_model_is_pinned_like_the_base_model(tmp_path, monkeypatch):
    from rundir.base_model import pin_hub_model

    commit = "89abcdef0123456789abcdef0123456789abcdef"
    repo = offline_hub_snapshot(monkeypatch, tmp_path / "hub", "acme/rm", commit)
    config = load_config(TINY_PROFILE, ["rl.reward.model.path=acme/rm"])
    problems, summary = reward_model_folder_problems(config.rl.reward.model)
    assert problems == [] and "hub id" in summary  # the pre-flight leaves it to the launch's pinning
    pinned = pin_hub_model(config).rl.reward.model
    assert (pinned.path, pinned.revision) == (str(repo / "snapshots" / commit), commit)
    with pytest.raises(ConfigError, match=r"- rl.reward.model.path: 'acme/rm' at revision 'v2' is neither"):
        pin_hub_model(load_config(TINY_PROFILE, ["rl.reward.model.path=acme/rm", "rl.reward.model.revision=v2"]))
