"""Data parallelism for a trainable role: R ranks (actors) in one process group, each
computing on its shard of every minibatch (S-FLOW-5), the model sharded by
trainer/sharding.py. Here is what FSDP2 does not do: joining the group (each rank is
its own process, so the default group is the role's; NCCL between GPUs, gloo on the
host), rank 0's initial weights for every rank, and diagnostics summed over the ranks.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

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
    mesh: DeviceMesh | None = None  # the role's FSDP2 mesh, once its model is sharded

    @property
    def active(self) -> bool:
        return self.world > 1

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
