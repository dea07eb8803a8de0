"""Weight publication gathers the full weights in bounded buckets (S-SCALE-3,
trainer/sharding.py): every tensor must come back exactly, under its own name,
however the buckets are cut, and no bucket may exceed its bound unless one tensor
alone does. (This file tested the hand-written gradient all-reduce's buckets before
FSDP2 replaced it; the sharded gather itself is tested in test_fsdp_update.py.)"""

from __future__ import annotations

import pytest
import torch

from trainer.sharding import full_weight_buckets, full_weights


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).to(torch.bfloat16), torch.nn.Linear(2, 2))


@pytest.mark.parametrize("bucket_bytes", [1, 40, 2**30])  # a bucket per tensor, a few, all in one
def test_every_weight_comes_back_in_place_whatever_the_buckets(bucket_bytes):
    model = _model()
    expected = model.state_dict()
    buckets = list(full_weight_buckets(model, keep=True, bucket_bytes=bucket_bytes))
    gathered = {name: tensor for bucket in buckets for name, tensor in bucket.items()}
    assert list(gathered) == list(expected)
    for name, tensor in expected.items():
        assert torch.equal(gathered[name], tensor) and gathered[name].dtype == tensor.dtype, name
    for bucket in buckets:
        sizes = [t.numel() * t.element_size() for t in bucket.values()]
        assert len(sizes) == 1 or sum(sizes) <= bucket_bytes
    if bucket_bytes == 1:
        assert len(buckets) == len(expected)


def test_a_rank_that_does_not_keep_gets_nothing_but_still_walks_every_bucket():
    model = _model()
    buckets = list(full_weight_buckets(model, keep=False, bucket_bytes=1))
    assert len(buckets) == len(model.state_dict()) and all(bucket == {} for bucket in buckets)
    assert full_weights(model, keep=False) == {}
