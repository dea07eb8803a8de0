"""Data parallelism for a trainable role: R actors (ranks) of one role, each holding
the whole model, each computing on its shard of every minibatch (S-FLOW-5).

Why hand-written all-reduce rather than `DistributedDataParallel`: DDP's reducer
binds gradient buckets to the parameters' device when it is built, and the colocated
policy moves its parameters to the host and back every iteration (S-RUN-4). Summing
the flattened gradients once per minibatch, after the micro-batches have been
accumulated, is the same arithmetic, survives the park, and costs one collective per
optimizer step instead of one per bucket per micro-batch.

Every rank ends every step with bit-identical parameters: they start identical
(rank 0's tensors are broadcast when the group forms), the all-reduced gradients are
identical on every rank, and so are the clipping and the optimizer step that follow.
That is why a checkpoint is written by rank 0 alone and loaded by every rank.

One process group per role: each rank is its own Ray actor process, so the default
group of torch.distributed is that role's group. NCCL between GPUs, gloo on the host.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable

import torch
import torch.distributed as dist

BUCKET_BYTES = 256 * 2**20
"""Largest flat gradient buffer one all-reduce sends: big enough that a small model
needs one collective per step, small enough that the copy costs little memory."""

COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""How long a rank waits in a collective for a peer that stopped answering before it
fails (a rank whose actor died makes the flow fail first, through its own call)."""


def rendezvous_address() -> str:
    """`tcp://host:port` of a free port on this node, for rank 0 to listen on. The
    host is the node's address as Ray knows it, so ranks on other nodes reach it."""
    try:
        import ray.util

        host = ray.util.get_node_ip_address()
    except Exception:  # outside Ray (in-process tests)
        host = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    return f"tcp://{host}:{port}"


@dataclass
class DataParallel:
    rank: int
    world: int

    @property
    def active(self) -> bool:
        return self.world > 1

    def all_reduce_gradients(self, parameters: Iterable[torch.nn.Parameter], bucket_bytes: int = BUCKET_BYTES) -> None:
        """Sum every gradient over the ranks, in place: one flat collective per bucket
        of same-dtype gradients (a bucket holds at most `bucket_bytes`, so the flat
        copy never doubles a large model's gradient memory).

        A parameter that got no gradient on this rank (a vision tower when this rank's
        shard had no image) contributes zeros, so every rank sends the same layout."""
        buckets: dict[torch.dtype, list[list[torch.nn.Parameter]]] = {}
        filled: dict[torch.dtype, int] = {}
        for param in parameters:
            if not param.requires_grad:
                continue
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            size = param.grad.numel() * param.grad.element_size()
            dtype = param.grad.dtype
            if dtype not in buckets or (filled[dtype] and filled[dtype] + size > bucket_bytes):
                buckets.setdefault(dtype, []).append([])
                filled[dtype] = 0
            buckets[dtype][-1].append(param)
            filled[dtype] += size
        for bucket in (b for per_dtype in buckets.values() for b in per_dtype):
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in bucket:
                count = p.grad.numel()
                p.grad.copy_(flat[offset : offset + count].view_as(p.grad))
                offset += count

    def all_reduce_sums(self, sums: dict[str, float], counts: dict[str, int], device: torch.device) -> None:
        """Diagnostics summed over every rank's micro-batches, in place, so each rank's
        receipt reports the whole minibatch schedule, not its shard."""
        names = sorted(sums)
        packed = torch.tensor(
            [sums[n] for n in names] + [float(counts[n]) for n in names], dtype=torch.float64, device=device
        )
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        for i, name in enumerate(names):
            sums[name] = float(packed[i])
            counts[name] = int(packed[len(names) + i])

    def broadcast_from_rank0(self, module: torch.nn.Module) -> None:
        """Every rank takes rank 0's parameters and buffers (a value head initialised
        differently on another rank would otherwise train apart forever)."""
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)


SINGLE = DataParallel(rank=0, world=1)


def join_group(address: str, rank: int, world: int, device: torch.device) -> DataParallel:
    """Join this role's process group; every rank calls it at once (it blocks until
    all `world` ranks have arrived)."""
    if world == 1:
        return SINGLE
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():
        raise RuntimeError(f"rank {rank}: this process already belongs to a process group")
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    return DataParallel(rank=rank, world=world)
