"""FSDP2 for a role's ranks (S-SCALE-1): parameters, gradients and optimizer state
sharded over the role's DeviceMesh, so each rank holds 1/N of them.

A role of one rank is not sharded: a mesh of one saves nothing, and the unsharded path
is the one the bitwise resume tests pin. FSDP and DTensor are imported only when a
model is sharded (they bring in sympy, and the driver imports this module without
sharding anything), so until then the checks below answer from `sys.modules`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Iterator

import torch

from compat.transformers_compat import declared_blocks
from models.lora import is_lora_model, lora_scaling, merged_weights

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

FSDP_MODULE = "torch.distributed.fsdp"
DTENSOR_MODULE = "torch.distributed.tensor"

PUBLISH_BUCKET_BYTES = 256 * 2**20
"""Largest group of gathered full parameters a rank holds on its device at once while
gathering (S-SCALE-3): one bucket is unsharded, copied to the host, dropped. Weight
publication takes its bound from `rl.rollout.weight_sync_bucket_mib` (the same default)."""


def _is_fsdp_module(value: Any) -> bool:
    fsdp = sys.modules.get(FSDP_MODULE)
    return fsdp is not None and isinstance(value, fsdp.FSDPModule)


def _is_dtensor(value: Any) -> bool:
    tensor = sys.modules.get(DTENSOR_MODULE)
    return tensor is not None and isinstance(value, tensor.DTensor)


def mixed_precision(device: torch.device) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 gradient reduction on GPUs; on the host everything stays
    in the parameters' own dtype, so a CPU run computes what one rank computes."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def block_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks, each its own FSDP unit (gathered one at a time in
    forward and backward): the classes a transformers model declares unsplittable
    (compat/transformers_compat.py), else the entries of its longest `ModuleList` (the
    layer stack). Without either the whole model would be one unit: the peak memory
    of an unsharded model, with nothing failing, so that is refused."""
    names = declared_blocks(model)
    blocks = [module for module in model.modules() if type(module).__name__ in names]
    if blocks:
        return blocks
    stacks = [module for module in model.modules() if isinstance(module, torch.nn.ModuleList)]
    if not stacks:
        raise ValueError(
            f"{type(model).__name__} names no blocks to shard (it declares no unsplittable blocks and has no "
            "ModuleList of layers): FSDP would gather the whole model at once"
        )
    return list(max(stacks, key=len))


def build_mesh(world: int, device: torch.device, shard: int | None = None) -> DeviceMesh:
    """One shard dimension over every rank, or (replicas, shard) for a role that
    spans nodes (HSDP: sharded within a node, replicated across; placement/mesh.py)."""
    from torch.distributed.device_mesh import init_device_mesh

    shard = world if shard is None else shard
    if shard == world:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (world // shard, shard), mesh_dim_names=("replicate", "shard"))


def shard_model(model: torch.nn.Module, world: int, device: torch.device, shard: int | None = None) -> DeviceMesh:
    """Shard `model` in place over the role's mesh (the default process group must
    exist). Parameters become DTensors, so an optimizer must be built after this."""
    from torch.distributed.fsdp import fully_shard

    mesh = build_mesh(world, device, shard)
    policy = mixed_precision(device)
    for block in block_modules(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if _is_fsdp_module(module):
            # The loss is weighted by the whole minibatch (every rank's shard), so the
            # reduction must sum, not average over the ranks; plain SUM, since gloo
            # has no pre-multiplied sum.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return mesh


def is_sharded(model: torch.nn.Module) -> bool:
    return _is_fsdp_module(model)


def set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """Reduce-scatter after this backward (the last micro-batch of a minibatch), or
    only accumulate locally (the others): one reduction per optimizer step."""
    if _is_fsdp_module(model):
        model.set_requires_gradient_sync(sync)


def clip_gradients(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """`clip_grad_norm_` for sharded gradients: the norm over every rank's shard
    (a DTensor reduced to a full tensor), then every shard scaled by the same factor."""
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if _is_dtensor(total):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor itself."""
    return tensor.to_local() if _is_dtensor(tensor) else tensor


def full_weight_buckets(
    model: torch.nn.Module, keep: bool, bucket_bytes: int = PUBLISH_BUCKET_BYTES
) -> Iterator[dict[str, torch.Tensor]]:
    """The full weights as host tensors, in buckets of at most `bucket_bytes` (a
    larger parameter is a bucket of its own). Every rank must iterate (each gather
    is a collective); only a rank with `keep` gets tensors, the others empty dicts.
    An unsharded model yields its own tensors (`.cpu()` copies nothing on the host).
    A LoRA model yields its merged weights under the base model's names: what a plain
    model of the family (a rollout engine's, an export's) loads (S-LORA-3)."""
    bucket: dict[str, torch.Tensor] = {}
    filled = 0
    for name, full in _full_tensors(model):
        size = full.numel() * full.element_size()
        if filled and filled + size > bucket_bytes:
            yield bucket
            bucket, filled = {}, 0
        if keep:
            bucket[name] = full.detach().cpu()
        filled += size
        del full
    if bucket or filled:
        yield bucket


def _full_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    named = (
        (name, tensor.full_tensor() if _is_dtensor(tensor) else tensor) for name, tensor in model.state_dict().items()
    )
    if is_lora_model(model):
        return merged_weights(named, lora_scaling(model))
    return named


def full_weights(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """Every bucket of `full_weight_buckets` in one host dict, for a weights-only
    artifact (weight publication streams the buckets instead: weights/publication.py)."""
    weights: dict[str, torch.Tensor] = {}
    for bucket in full_weight_buckets(model, keep):
        weights.update(bucket)
    return weights
