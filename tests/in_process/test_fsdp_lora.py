"""LoRA adapters on FSDP2 ranks (S-LORA-2 with S-SCALE-1/2): two gloo ranks train the
adapters of a sharded model as one rank does, their boundary holds the adapters and
their optimizer state alone, and a LoRA boundary resumes on another rank count (1 -> 2, 2 -> 1)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from checkpoint.dcp_io import SafeReader
from tests.in_process.fsdp_ranks import lora_save_and_resume, runtime, spawn, train, write_result

LORA_RANK = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp-lora")
    one = root / "one"
    one.mkdir()
    update = runtime(0, 1, "", lora_rank=LORA_RANK)
    train(update, (1,))
    update.save(str(one / "boundary"), {})
    write_result(one, 0, update, train(update, (2,)), "uninterrupted")
    spawn(lora_save_and_resume, 2, root / "two", {"lora_rank": LORA_RANK, "from_one": str(one / "boundary")})
    return root


def _assert_same_weights(got_path, expected_path):
    got, expected = load_file(got_path), load_file(expected_path)
    assert sorted(got) == sorted(expected)
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-5, msg=name)


def test_two_sharded_lora_ranks_train_like_one_and_publish_merged_weights(runs):
    """S-LORA-3: the gathered weights are the merged model under the base names."""
    _assert_same_weights(runs / "two" / "uninterrupted.safetensors", runs / "one" / "uninterrupted.safetensors")
    names = load_file(runs / "two" / "uninterrupted.safetensors")
    assert not [n for n in names if "lora_" in n or n.startswith("base_model.")]


def test_a_sharded_lora_boundary_holds_only_the_adapters_and_their_optimizer_state(runs):
    """S-LORA-2: the frozen base is not in the shards, nor in the optimizer."""
    for part in ("model", "optimizer"):
        keys = list(SafeReader(str(runs / "two" / "boundary" / part)).read_metadata().state_dict_metadata)
        assert keys and all(".lora_A." in key or ".lora_B." in key for key in keys), (part, keys[:3])


def test_a_one_rank_lora_boundary_resumes_on_two_ranks(runs):
    _assert_same_weights(runs / "two" / "from_one.safetensors", runs / "one" / "uninterrupted.safetensors")


def test_a_two_rank_lora_boundary_resumes_on_one_rank(runs, tmp_path):
    update = runtime(0, 1, "", lora_rank=LORA_RANK)
    state = update.load(str(runs / "two" / "boundary"))
    assert state["sharded_ranks"] == 2 and update.optimizer_step == 4
    write_result(tmp_path, 0, update, train(update, (2,)), "resumed")
    _assert_same_weights(tmp_path / "resumed.safetensors", runs / "one" / "uninterrupted.safetensors")
