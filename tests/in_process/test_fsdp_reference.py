"""The frozen reference shards too (S-SCALE-1): two gloo reference ranks, each holding
half of the weights and no gradients, score the same sampled-token log-probs as one
unsharded rank within 1e-5. The real role body (roles/reference_role.py) on the CPU
profile's tiny model, ranks spawned as in test_fsdp_update.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import TINY_PROFILE
from tests.in_process.fsdp_ranks import score_reference, spawn


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference-one")
    score_reference(0, 1, "", str(out), {"profile": TINY_PROFILE, "model": tiny_model_dir})
    return out


def test_two_sharded_reference_ranks_score_like_one(one_rank, tiny_model_dir, tmp_path):
    spawn(score_reference, 2, tmp_path, {"profile": TINY_PROFILE, "model": tiny_model_dir})
    expected = load_file(one_rank / "scored.safetensors")["ref_logprobs"]
    got = load_file(tmp_path / "scored.safetensors")["ref_logprobs"]
    assert (expected != 0).sum() > 10  # real log-probs, the padded positions masked to 0
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    total = json.loads((one_rank / "held_0.json").read_text())
    ranks = [json.loads((tmp_path / f"held_{rank}.json").read_text()) for rank in (0, 1)]
    # Each rank holds its half of every weight (dim 0 split, rank 0 taking the odd row;
    # tied embeddings counted once), frozen: nothing requires a gradient.
    assert sum(rank["held"] for rank in ranks) == total["held"]
    assert max(rank["held"] for rank in ranks) < 0.505 * total["held"]  # resharded after scoring
    assert not any(entry["requires_grad"] for entry in (total, *ranks))
