"""The manifest's memory estimate (S-RUN-3, S-RM-1): each device group's bytes from the
parameter counts of its roles' models, read from safetensors headers or config.json,
never loaded and never downloaded. Models here are hand-written safetensors files, so
every expected number is counted in a comment."""

from __future__ import annotations

import io
import json
import socket

import numpy
import pytest
from safetensors.numpy import save_file

from cli.manifest import check_manifest, validate_manifest
from configs.loading import load_config
from placement.memory_estimate import estimate_memory
from placement.plan import plan_placement
from tests.conftest import REPO_ROOT, TINY_PROFILE

GPU_PROFILE = str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py")

# 704 parameters: embed 32x8=256, q_proj 8x8=64, up_proj 16x8=128, lm_head 32x8=256.
POLICY_TENSORS = {"model.embed_tokens.weight": (32, 8), "model.layers.0.self_attn.q_proj.weight": (8, 8),
                  "model.layers.0.mlp.up_proj.weight": (16, 8), "lm_head.weight": (32, 8)}
# 132 parameters: embed 32x4=128, score 1x4=4.
REWARD_TENSORS = {"model.embed_tokens.weight": (32, 4), "score.weight": (1, 4)}


def _model(folder, architecture: str, tensors: dict[str, tuple[int, ...]], hidden: int) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "qwen3", "architectures": [architecture], "hidden_size": hidden}))
    save_file({name: numpy.zeros(shape, dtype=numpy.float32) for name, shape in tensors.items()},
              str(folder / "model.safetensors"))
    return str(folder)


@pytest.fixture
def models(tmp_path) -> tuple[str, str]:
    return (_model(tmp_path / "policy", "Qwen3ForCausalLM", POLICY_TENSORS, hidden=8),
            _model(tmp_path / "rm", "Qwen3ForSequenceClassification", REWARD_TENSORS, hidden=4))


def _groups(profile: str, overrides: list[str]) -> dict[str, object]:
    config = load_config(profile, overrides)
    return {"+".join(g.group.roles): g for g in estimate_memory(config, plan_placement(config))}


def _reward_overrides(models, tmp_path) -> list[str]:
    policy, reward = models
    return [f"model.path={policy}", "model.dtype=bfloat16", "rl.reward.terminal=none", f"rl.reward.model.path={reward}",
            f"job.output_root={tmp_path / 'outputs'}"]


def test_the_reward_model_weights_are_in_its_group_beside_the_reference_or_its_own(models, tmp_path):
    beside = _groups(GPU_PROFILE, _reward_overrides(models, tmp_path))
    # reference 704 x 2 bytes (bfloat16) = 1408, reward model 132 x 4 (rl.reward.model.dtype float32) = 528
    assert beside["reference+reward"].bytes == 1408 + 528
    own = _groups(GPU_PROFILE, [*_reward_overrides(models, tmp_path), "grid.reward_placement=own",
                                "grid.reward_gpus=1", "grid.gpus_per_node=5"])
    assert (own["reference"].bytes, own["reward"].bytes) == (1408, 528)

    report = check_manifest(load_config(GPU_PROFILE, _reward_overrides(models, tmp_path)))
    line = next(line for line in report.summary if line.startswith("memory: reference+reward on 1 GPU:"))
    assert line.startswith("memory: reference+reward on 1 GPU: 1.9 KiB per GPU = reference 1.4 KiB (704 params")
    assert line.endswith(" + reward 0.5 KiB (132 params, float32 weights, frozen; safetensors headers)")


def test_a_trained_role_costs_four_copies_and_a_frozen_one_its_weights(models, tmp_path):
    groups = _groups(TINY_PROFILE, [f"model.path={models[0]}", "model.tiny=null"])
    # on the host, unsharded, float32: policy 704 x 4 bytes x 4 copies (weights, gradients, 2 AdamW moments)
    assert groups["policy+rollout"].role("policy").bytes == 704 * 4 * 4
    assert groups["reference"].bytes == 704 * 4  # the same model frozen: weights only
    # the critic drops lm_head (256) and gets score 1x8 + bias 1: 457 params x 16
    assert groups["critic"].bytes == 457 * 16
    assert groups["policy+rollout"].bytes == 704 * 16 + 704 * 4  # no offload on the host: both resident


def test_lora_trains_only_the_adapters(models):
    full = _groups(TINY_PROFILE, [f"model.path={models[0]}", "model.tiny=null"])
    lora = _groups(TINY_PROFILE, [f"model.path={models[0]}", "model.tiny=null", "model.lora.rank=2"])
    # adapters on q_proj 2 x (8 + 8) = 32 and up_proj 2 x (16 + 8) = 48: 80 params, float32 x 4 copies
    assert lora["policy+rollout"].role("policy").bytes == 704 * 4 + 80 * 16 < full["policy+rollout"].role(
        "policy").bytes
    assert lora["critic"].bytes == 457 * 4 + (80 + 9) * 16  # the value head (9 params) trains whole
    assert lora["reference"].bytes == full["reference"].bytes


def test_fsdp_shards_divide_and_a_group_over_the_stated_gpu_memory_is_noted(models, tmp_path):
    overrides = [*_reward_overrides(models, tmp_path), "grid.gpu_memory_gib=0.000001"]  # about 1 KiB per GPU
    groups = _groups(GPU_PROFILE, overrides)
    # policy 704 x 2 bytes x 4 copies / 2 FSDP2 shards = 2816; vLLM reserves 0.45 of 1073 bytes = 483
    assert groups["policy+rollout"].role("policy").bytes == 2816
    assert groups["policy+rollout"].bytes == 2816  # offload: the larger of the two, not the sum
    out = _validate(GPU_PROFILE, overrides)  # printed whatever else the check finds (no tokenizer here)
    notes = [line for line in out.splitlines() if line.startswith("note: memory:")]
    assert [note.split(" group ")[0] for note in notes] == [
        "note: memory: the policy+rollout", "note: memory: the reference+reward", "note: memory: the critic"]
    assert "over grid.gpu_memory_gib=1e-06" in notes[0]


def test_the_cpu_profile_prints_host_memory_per_group(models, tmp_path):
    out = _validate(TINY_PROFILE, [f"model.path={models[0]}", "model.tiny=null",
                                   f"job.output_root={tmp_path / 'outputs'}"])
    lines = [line for line in out.splitlines() if line.startswith("memory:")]
    assert lines[0] == "memory: estimated from parameter counts per device group (activations not estimated)"
    assert lines[1].startswith("memory: policy+rollout on the host: 13.8 KiB of host memory = policy 11.0 KiB")
    assert [line.split(":")[1] for line in lines[1:]] == [" policy+rollout on the host", " reference on the host",
                                                           " critic on the host"]


def test_a_hub_id_not_on_disk_is_unknown_and_nothing_is_downloaded(tmp_path, monkeypatch):
    import huggingface_hub.constants

    connections = []

    def no_network(sock, address):
        connections.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    groups = _groups(GPU_PROFILE, ["model.path=acme/not-here"])
    assert {name: group.bytes for name, group in groups.items()} == {
        "policy+rollout": None, "reference": None, "critic": None}
    assert "acme/not-here is a hub id that is not in the local Hugging Face cache; nothing was downloaded" in (
        groups["reference"].describe())
    assert connections == [] and not (tmp_path / "hub").exists()


def test_a_cached_config_alone_gives_the_decoder_size(tmp_path, monkeypatch):
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "tie_word_embeddings": True}))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    groups = _groups(GPU_PROFILE, [])
    # embed 151936 x 1024 = 155,582,464; per layer q,o 2 x 2048 x 1024 + k,v 2 x 1024 x 1024 + MLP 3 x 3072 x 1024
    # + 2 norms of 1024 = 15,730,688, x 28 = 440,459,264; final norm 1024: 596,042,752 (the real checkpoint holds
    # 7,168 more, Qwen3's q/k norms), in bfloat16 on the reference's one GPU
    assert groups["reference"].bytes == 596_042_752 * 2


def _validate(profile: str, overrides: list[str]) -> str:
    out = io.StringIO()
    validate_manifest(profile, overrides, out=out, err=io.StringIO())
    return out.getvalue()


def test_a_reward_model_beside_a_sharded_reference_is_whole_on_one_gpu(models, tmp_path):
    groups = _groups(GPU_PROFILE, [*_reward_overrides(models, tmp_path), "grid.reference_gpus=2",
                                   "grid.gpus_per_node=5"])
    # reference 1408 bytes / 2 FSDP2 shards = 704, plus the whole reward model (528) on the GPU that holds it
    assert groups["reference+reward"].bytes == 704 + 528
    assert groups["reference+reward"].role("reward").made_of.endswith("one actor: on one of the 2 GPUs")
