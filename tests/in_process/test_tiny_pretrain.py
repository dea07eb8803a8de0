"""The warm-started tiny model: pre-training is part of building it, deterministic,
and never sees a held-out sum."""

import hashlib
import json
from pathlib import Path

import pytest

from configs.loading import ConfigError, load_config
from configs.schema import TinyModelSpec
from data.synthetic import addition_split, heldout_sums
from models.tiny_model import build_tiny_model
from models.tiny_pretrain import pretrain_rows


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_train_and_heldout_sums_never_share_an_operand_pair():
    train = {row["prompt"] for row in addition_split(3000, seed=1, split="train")}
    heldout = {row["prompt"] for row in heldout_sums()}
    assert train and heldout and not train & heldout
    # About a tenth of the 100 x 100 pairs is held out (the hash split, not a digit rule).
    assert 800 < len(heldout) < 1200
    # What pre-training is actually fed, not just the split it draws from, holds no held-out pair.
    pretrained = {row["prompt"] for row in pretrain_rows("addition", 3000, seed=1, max_operand=99)}
    assert pretrained and not pretrained & heldout
    assert all(row["reference"] == str(eval(row["prompt"][:-1])) for row in heldout_sums(9))


def test_pretraining_is_deterministic_and_changes_the_weights(tmp_path):
    spec = TinyModelSpec(
        task_alphabet="0123456789+=", pretrain_task="addition", pretrain_steps=6, pretrain_batch_size=8
    )
    first = build_tiny_model(tmp_path / "a", spec)
    second = build_tiny_model(tmp_path / "b", spec)
    untrained = build_tiny_model(tmp_path / "c", spec.model_copy(update={"pretrain_task": "none"}))
    assert _digest(first) == _digest(second) != _digest(untrained)
    report = json.loads((first / "tiny_pretrain.json").read_text())
    assert report["task"] == "addition" and report["steps"] == 6 and report["examples"] == 48
    assert not (untrained / "tiny_pretrain.json").exists()


def test_addition_pretraining_needs_its_characters_in_the_alphabet():
    with pytest.raises(ConfigError, match="task_alphabet"):
        load_config("configs/ppo_tiny_arith_cpu.py", ["model.tiny.task_alphabet=0123456789"])
