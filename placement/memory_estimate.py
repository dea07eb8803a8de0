"""Memory each device group needs per GPU, estimated from the parameter counts of the
models its roles hold (S-RUN-3, S-RM-1), so a run that cannot fit shows on a laptop
rather than as an out-of-memory error on the node.

Bytes per parameter, with b the bytes of the role's dtype:
- a trained role (policy, critic): 4b, for weights, gradients and AdamW's two moments,
  all kept in the parameters' dtype (torch's AdamW states are `zeros_like(param)`, and
  FSDP2 gives sharded gradients the parameter's dtype);
- with LoRA: b for the frozen base, 16 for each adapter parameter (and the critic's value
  head), which PEFT keeps in float32 whatever the base dtype: the same four copies;
- a frozen role (reference, reward model): b, weights only;
- the rollout engine: b for its weights, split over its tensor-parallel GPUs; vLLM
  reserves `rl.rollout.gpu_memory_utilization` of each GPU for weights and KV cache,
  counted when `grid.gpu_memory_gib` says what a GPU holds.
FSDP2 divides all of a sharded role's state (policy, critic, reference) by its shard
size (placement/mesh.py); the reward model is one unsharded actor. With colocated
offload the trainer is parked while the engine generates and the engine sleeps while
the trainer updates, so that group's peak is the larger of the two, not their sum.
Not estimated: activations, logits, transformers' KV cache, the CUDA context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from configs.schema import PPOConfig
from models.lora_targets import matches
from models.weight_shapes import Shapes, WeightShapes, read_weight_shapes
from placement.mesh import role_mesh
from placement.plan import DeviceGroup, PlacementPlan

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TRAINED_COPIES = 4  # weights, gradients, AdamW exp_avg and exp_avg_sq
ADAPTER_BYTES = 4  # PEFT upcasts adapters to float32 (get_peft_model's autocast_adapter_dtype)
GIB = 2**30
NOT_COUNTED = "activations not estimated"


@dataclass(frozen=True)
class RoleMemory:
    role: str
    bytes: int | None  # per GPU of its group (on the host: all its ranks together); None: unknown
    made_of: str

    def describe(self) -> str:
        return f"{self.role} {format_bytes(self.bytes)} ({self.made_of})"


@dataclass(frozen=True)
class GroupMemory:
    group: DeviceGroup
    roles: tuple[RoleMemory, ...]
    on_host: bool
    in_turn: tuple[str, ...] = ()  # roles resident one at a time (colocated offload)

    @property
    def bytes(self) -> int | None:
        """Peak per GPU (on the host: in all); None when a role's model is unknown."""
        if any(role.bytes is None for role in self.roles):
            return None
        resident = sum(role.bytes or 0 for role in self.roles if role.role not in self.in_turn)
        return resident + max((role.bytes or 0 for role in self.roles if role.role in self.in_turn), default=0)

    def role(self, name: str) -> RoleMemory:
        return next(role for role in self.roles if role.role == name)

    def describe(self) -> str:
        gpus = f"{self.group.gpus} GPU{'s' if self.group.gpus != 1 else ''}"
        head = f"memory: {'+'.join(self.group.roles)} on {'the host' if self.on_host else gpus}:"
        known = [role for role in self.roles if role.bytes is not None]
        if len(known) < len(self.roles):
            unknown = [role for role in self.roles if role.bytes is None]
            reasons = "; ".join(dict.fromkeys(role.made_of for role in unknown))
            besides = f"; besides: {' + '.join(role.describe() for role in known)}" if known else ""
            return f"{head} unknown: {', '.join(role.role for role in unknown)} ({reasons}){besides}"
        alternating = [role.describe() for role in self.roles if role.role in self.in_turn]
        parts = [role.describe() for role in self.roles if role.role not in self.in_turn]
        if alternating:
            parts.insert(0, f"the larger of {' or '.join(alternating)}, resident in turn (colocated offload)")
        amount = f"{format_bytes(self.bytes)} {'of host memory' if self.on_host else 'per GPU'}"
        return f"{head} {amount} = {' + '.join(parts)}"


def format_bytes(value: int | None) -> str:
    if value is None:
        return "unknown"
    if value >= GIB // 10:
        return f"{value / GIB:.2f} GiB"
    return f"{value / 2**20:.1f} MiB" if value >= 2**20 else f"{value / 2**10:.1f} KiB"


def format_count(parameters: int) -> str:
    if parameters >= 10**9:
        return f"{parameters / 1e9:.2f}B"
    return f"{parameters / 1e6:.2f}M" if parameters >= 10**5 else f"{parameters:,}"


def estimate_memory(config: PPOConfig, plan: PlacementPlan) -> tuple[GroupMemory, ...]:
    """One estimate per device group of `plan`, in the plan's order."""
    estimates = []
    for group in plan.groups:
        on_host = not plan.uses_gpus or group.gpus == 0
        roles = tuple(_role_memory(config, plan, role, on_host) for role in group.roles)
        in_turn = ("policy", "rollout") if plan.offload_active and {"policy", "rollout"} <= set(group.roles) else ()
        estimates.append(GroupMemory(group, roles, on_host, in_turn))
    return tuple(estimates)


def memory_lines(estimates: tuple[GroupMemory, ...]) -> list[str]:
    """The manifest's summary lines: what is counted, then one line per device group."""
    return [f"memory: estimated from parameter counts per device group ({NOT_COUNTED})",
            *(estimate.describe() for estimate in estimates)]


def memory_notes(config: PPOConfig, estimates: tuple[GroupMemory, ...]) -> list[str]:
    """A note for each GPU group estimated over `grid.gpu_memory_gib`."""
    limit = config.grid.gpu_memory_gib
    if limit is None:
        return []
    return [
        f"memory: the {'+'.join(estimate.group.roles)} group needs about {format_bytes(estimate.bytes)} per GPU "
        f"before activations, over grid.gpu_memory_gib={limit:g} ({estimate.group.key}={estimate.group.gpus})"
        for estimate in estimates
        if not estimate.on_host and estimate.bytes is not None and estimate.bytes > limit * GIB
    ]


def _role_memory(config: PPOConfig, plan: PlacementPlan, role: str, on_host: bool) -> RoleMemory:
    model = config.model
    if role == "reward":
        settings = config.rl.reward.model
        assert settings is not None and settings.path is not None  # only a loaded reward model joins a group
        memory = _frozen(role, _read(settings.path, settings.revision, _spec_key(config, settings.path)),
                         settings.dtype, shard=1)
        group = plan.group_of(role)
        if memory.bytes is None or on_host or group is None or group.gpus == 1:
            return memory
        return RoleMemory(role, memory.bytes, f"{memory.made_of}; one actor: on one of the {group.gpus} GPUs")
    dtype = model.dtype
    shard = 1 if on_host else role_mesh(plan, role).shard
    if role == "critic":
        source = model.critic_path or model.path
        revision = None if model.critic_path else model.revision
        return _trained(role, _as_critic(_read(source, revision, _spec_key(config, source))), config, shard)
    shapes = _read(model.path, model.revision, _spec_key(config, model.path))
    if role == "policy":
        return _trained(role, shapes, config, shard)
    if role == "reference":
        return _frozen(role, shapes, dtype, shard)
    return _rollout(shapes, config, plan, on_host)


def _read(path: str, revision: str | None, spec_key: str | None) -> WeightShapes:
    shapes = read_weight_shapes(path, revision)
    if shapes.shapes is None and spec_key is not None:
        return WeightShapes(None, f"{path} is built at start-up from {spec_key}; check again once it exists")
    return shapes


def _spec_key(config: PPOConfig, folder: str) -> str | None:
    """The key of the tiny spec the launch builds `folder` from, if any."""
    if folder == config.model.path and config.model.tiny is not None:
        return "model.tiny"
    reward = config.rl.reward.model
    if reward is not None and folder == reward.path and reward.tiny is not None:
        return "rl.reward.model.tiny"
    return None


def _as_critic(shapes: WeightShapes) -> WeightShapes:
    """The critic loads its source as a token classifier: the backbone, and a one-output
    `score` head (kept from a reward model, new otherwise) instead of the LM head."""
    if shapes.shapes is None:
        return shapes
    body: Shapes = {name: shape for name, shape in shapes.shapes.items() if not name.startswith("lm_head.")}
    if not any(name.endswith("score.weight") for name in body) and shapes.hidden_size:
        body.update({"score.weight": (1, shapes.hidden_size), "score.bias": (1,)})
    return WeightShapes(body, shapes.source, shapes.hidden_size)


def _frozen(role: str, shapes: WeightShapes, dtype: str, shard: int) -> RoleMemory:
    if shapes.parameters is None:
        return RoleMemory(role, None, shapes.source)
    return RoleMemory(role, shapes.parameters * DTYPE_BYTES[dtype] // shard,
                      f"{format_count(shapes.parameters)} params, {dtype} weights, frozen{_sharded(shard)}; "
                      f"{shapes.source}")


def _trained(role: str, shapes: WeightShapes, config: PPOConfig, shard: int) -> RoleMemory:
    if shapes.shapes is None or shapes.parameters is None:
        return RoleMemory(role, None, shapes.source)
    dtype, lora = config.model.dtype, config.model.lora
    total = shapes.parameters
    if not lora.enabled:
        return RoleMemory(role, TRAINED_COPIES * total * DTYPE_BYTES[dtype] // shard,
                          f"{format_count(total)} params: weights, gradients, 2 AdamW moments in {dtype}"
                          f"{_sharded(shard)}; {shapes.source}")
    trained = _adapter_parameters(shapes.shapes, lora.rank, lora.target_modules)
    if role == "critic":  # the value head trains whole (PEFT's modules_to_save)
        trained += sum(math.prod(shape) for name, shape in shapes.shapes.items() if name.startswith("score."))
    memory = total * DTYPE_BYTES[dtype] + TRAINED_COPIES * trained * ADAPTER_BYTES
    return RoleMemory(role, memory // shard,
                      f"{format_count(total)} frozen {dtype} params + {format_count(trained)} trained by LoRA rank "
                      f"{lora.rank} (float32 weights, gradients, 2 AdamW moments){_sharded(shard)}; {shapes.source}")


def _rollout(shapes: WeightShapes, config: PPOConfig, plan: PlacementPlan, on_host: bool) -> RoleMemory:
    if shapes.parameters is None:
        return RoleMemory("rollout", None, shapes.source)
    rollout, dtype = config.rl.rollout, config.model.dtype
    weights = shapes.parameters * DTYPE_BYTES[dtype]
    if on_host:
        engines = plan.ranks("rollout")
        copies = f"{engines} engines x " if engines > 1 else ""
        return RoleMemory("rollout", engines * weights,
                          f"{copies}{format_count(shapes.parameters)} params, {dtype} weights; {shapes.source}")
    tp = plan.rollout_tensor_parallel_size
    split = f", split over {tp} GPUs (tensor parallel)" if tp > 1 else ""
    made_of = f"{format_count(shapes.parameters)} params, {dtype} weights{split}; {shapes.source}"
    if rollout.engine != "vllm":
        return RoleMemory("rollout", weights // tp, made_of)
    share = f"rl.rollout.gpu_memory_utilization={rollout.gpu_memory_utilization:g}"
    limit = config.grid.gpu_memory_gib
    if limit is None:
        return RoleMemory("rollout", weights // tp, f"{made_of}; vLLM's KV cache fills {share} of the GPU with "
                                                    "them, not counted: set grid.gpu_memory_gib")
    reserved = int(rollout.gpu_memory_utilization * limit * GIB)
    return RoleMemory("rollout", max(reserved, weights // tp),
                      f"vLLM reserves {share} of grid.gpu_memory_gib={limit:g} for weights and KV cache: {made_of}")


def _adapter_parameters(shapes: Shapes, rank: int, targets: list[str]) -> int:
    """PEFT's LoRA: lora_A (r, in) and lora_B (out, r) beside each targeted linear layer."""
    total = 0
    for name, shape in shapes.items():
        module = name.removesuffix(".weight")
        if len(shape) == 2 and module != name and any(matches(target, module) for target in targets):
            total += rank * (shape[0] + shape[1])
    return total


def _sharded(shard: int) -> str:
    return f", FSDP2 shard 1/{shard}" if shard > 1 else ""
