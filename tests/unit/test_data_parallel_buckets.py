"""The gradient all-reduce of trainer/data_parallel.py packs gradients into buckets;
with a one-rank gloo group (a sum over one rank is the identity) every gradient must
come back exactly, in its own place, however the buckets are cut."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from trainer.data_parallel import DataParallel, rendezvous_address


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method=rendezvous_address(), rank=0, world_size=1)
    yield DataParallel(rank=0, world=1)
    dist.destroy_process_group()


@pytest.mark.parametrize("bucket_bytes", [1, 40, 2**30])  # a bucket per tensor, a few, all in one
def test_every_gradient_comes_back_in_place_whatever_the_buckets(one_rank_group, bucket_bytes):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).to(torch.bfloat16), torch.nn.Linear(2, 2))
    model[2].weight.requires_grad_(False)
    unused = torch.nn.Parameter(torch.ones(5))  # no gradient on this rank: sent as zeros
    x = torch.randn(6, 4)
    model[2](model[1](model[0](x).to(torch.bfloat16)).float()).sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    one_rank_group.all_reduce_gradients([*model.parameters(), unused], bucket_bytes=bucket_bytes)

    for name, p in model.named_parameters():
        if name in expected:
            assert torch.equal(p.grad, expected[name]) and p.grad.dtype == expected[name].dtype, name
    assert model[2].weight.grad is None  # frozen: untouched
    assert torch.equal(unused.grad, torch.zeros(5))
