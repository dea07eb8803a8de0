"""Sharded checkpoints with torch.distributed.checkpoint (S-SCALE-2): every rank
writes its own shard file beside one `.metadata`; a boundary loads at any rank
count (2 -> 1, 1 -> 2) and continues like the run that saved it; at the same rank
count the resumed update is bitwise the uninterrupted one (S-CKPT-8); the final
export is one consolidated safetensors model that `from_pretrained` loads."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.in_process.fsdp_ranks import resume_and_continue, runtime, save_and_continue, spawn, train, write_result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One rank and two ranks, each: iteration 1, save, iteration 2; then two ranks
    resumed from either boundary. Spawned once for the module (each spawn imports
    torch and transformers in two processes)."""
    root = tmp_path_factory.mktemp("fsdp-checkpoint")
    one = root / "one"
    one.mkdir()
    update = runtime(0, 1, "")
    train(update, (1,))
    update.save(str(one / "boundary"), {})
    write_result(one, 0, update, train(update, (2,)), "uninterrupted")
    spawn(save_and_continue, 2, root / "two")
    boundaries = {"from_two": str(root / "two" / "boundary"), "from_one": str(one / "boundary")}
    spawn(resume_and_continue, 2, root / "resumed", {"boundaries": boundaries})
    return root


def _weights(path):
    return load_file(path)


def test_a_two_rank_save_is_a_dcp_layout_with_one_file_per_rank(runs):
    for part in ("model", "optimizer"):
        names = sorted(p.name for p in (runs / "two" / "boundary" / part).iterdir())
        assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"], part
    assert (runs / "two" / "boundary" / "optimizer_param_groups.json").exists()
    assert not (runs / "two" / "boundary" / "model.safetensors").exists()


def test_a_pristine_sharded_optimizer_saves_nothing_and_stays_pristine(runs):
    """S-CW-7 on sharded ranks: the save before any step wrote no optimizer shards and
    left no state behind (the spawned ranks check `optimizer.state` themselves), and
    the uninterrupted run trained on after it like the one-rank run."""
    import json

    pristine = runs / "two" / "pristine"
    assert json.loads((pristine / "trainer_state.json").read_text())["optimizer_pristine"] is True
    assert not (pristine / "optimizer").exists() and (pristine / "model" / ".metadata").exists()
    expected = _weights(runs / "one" / "uninterrupted.safetensors")
    for name, tensor in _weights(runs / "two" / "uninterrupted.safetensors").items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-5, msg=name)


def test_same_rank_count_resume_is_bitwise(runs):
    uninterrupted = _weights(runs / "two" / "uninterrupted.safetensors")
    resumed = _weights(runs / "resumed" / "from_two.safetensors")
    for name, tensor in uninterrupted.items():
        assert torch.equal(resumed[name], tensor), name


def test_a_one_rank_boundary_resumes_on_two_ranks(runs):
    expected = _weights(runs / "one" / "uninterrupted.safetensors")
    resumed = _weights(runs / "resumed" / "from_one.safetensors")
    for name, tensor in expected.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-5, msg=name)


def test_a_two_rank_boundary_resumes_on_one_rank(runs, tmp_path):
    update = runtime(0, 1, "")
    state = update.load(str(runs / "two" / "boundary"))
    assert state["sharded_ranks"] == 2 and update.optimizer_step == 4
    write_result(tmp_path, 0, update, train(update, (2,)), "resumed")
    expected = _weights(runs / "one" / "uninterrupted.safetensors")
    resumed = _weights(tmp_path / "resumed.safetensors")
    for name, tensor in expected.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-5, msg=name)


def test_a_sharded_role_exports_as_one_safetensors_model(runs, tmp_path):
    from transformers import AutoModelForCausalLM

    from checkpoint.export import _from_shards

    _from_shards(AutoModelForCausalLM, str(runs / "two" / "boundary")).save_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    saved = _weights(runs / "two" / "after_1.safetensors")
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
