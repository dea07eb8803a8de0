"""`model.lora` refusals before anything starts (S-LORA-1): bad values name their key,
and target modules a local checkpoint lacks are refused by the pre-flight from the
safetensors header alone (no torch, no model built)."""

from __future__ import annotations

import json
import struct

import pytest

from rundir.preflight import config_problems
from configs.loading import ConfigError, load_config
from tests.conftest import REPO_ROOT, TINY_PROFILE

QWEN3_WEIGHTS = [
    "model.embed_tokens.weight", "model.norm.weight",
    *(f"model.layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
    *(f"model.layers.0.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")),
]


def _checkpoint(folder, names):
    """A safetensors file whose header names `names` (the pre-flight reads only the header)."""
    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, name in enumerate(names)}
    payload = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(payload)) + payload + bytes(4 * len(names)))
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return folder


@pytest.mark.parametrize("override, key", [
    ("model.lora.rank=-1", "model.lora.rank"),
    ("model.lora.alpha=0", "model.lora.alpha"),
    ("model.lora.dropout=1", "model.lora.dropout"),
    ("model.lora.target_modules=[]", "model.lora.target_modules"),
    ('model.lora.target_modules=["q_proj","q_proj"]', "model.lora.target_modules"),
])
def test_bad_lora_values_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=rf"{key}: "):
        load_config(TINY_PROFILE, [override])


def test_target_modules_the_checkpoint_lacks_are_refused_by_the_preflight(tmp_path):
    model = _checkpoint(tmp_path, QWEN3_WEIGHTS)
    config = load_config(TINY_PROFILE, [f"model.path={model}", "model.lora.rank=8",
                                        'model.lora.target_modules=["q_proj","c_attn","fc1"]'])
    problems = config_problems(config)
    assert [p.key for p in problems] == ["model.lora.target_modules"]
    assert problems[0].message.startswith("c_attn, fc1 name(s) no module of the model")
    assert "gate_proj" in problems[0].message  # what the model does have


def test_the_default_targets_fit_qwen3_and_rank_0_checks_nothing(tmp_path):
    model = _checkpoint(tmp_path, QWEN3_WEIGHTS)
    assert config_problems(load_config(TINY_PROFILE, [f"model.path={model}", "model.lora.rank=8"])) == []
    unknown = 'model.lora.target_modules=["c_attn"]'
    assert config_problems(load_config(TINY_PROFILE, [f"model.path={model}", unknown])) == []  # rank 0: LoRA off


def test_lora_on_a_vision_language_model_is_refused():
    config = load_config(str(REPO_ROOT / "configs" / "ppo_tiny_vlm_cpu.py"), ["model.lora.rank=8"])
    assert [p.key for p in config_problems(config)] == ["model.lora.rank"]
