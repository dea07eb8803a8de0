"""The update runtime both trainable roles share: optimizer, scheduler, the
epoch × minibatch × micro-batch loop of the update plan, and role checkpoints.

Policy and critic differ only in the loss they hand to `run_plan`; everything
about *how* an update happens lives here once, including where it happens: the
runtime owns its device (the role's GPU, or the host), and moving the model and the
optimizer state between the two is what a colocated trainer's park is (S-RUN-4).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import defaultdict
from typing import Any, Callable

import torch

from algorithm.loss_aggregation import loss_aggregation
from algorithm.update_plan import SHAPE_NAMES, MicroBatch, PlanShape, UpdatePlan, held_shape
from checkpoint.role_state import RoleSaveReport, load_trainable_role, save_model_only, save_trainable_role
from configs.schema import OptimizerConfig
from contracts.trajectory import PPOTargets
from models.lora import is_lora_model
from trainer.data_parallel import SINGLE, DataParallel, join_group
from trainer.pinned_park import PinnedHostCopies, move_state, optimizer_state_slots
from trainer.sharding import clip_gradients, full_weights, is_sharded, local_part, set_gradient_sync, shard_model

LossFn = Callable[[PPOTargets, MicroBatch], tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""(targets, micro-batch) -> the per-token loss (m, r') over the micro-batch's response
columns (`micro.response`), and diagnostics. The runtime reduces it (S-PATH-2)."""


def resolve_device(device: str | torch.device) -> torch.device:
    """A bare "cuda" pinned to its index (inside a Ray actor, the bundle's GPU is the
    only one visible: cuda:0), so `tensor.device == device` comparisons are exact."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds: its shard of a sharded (DTensor) parameter or state."""
    tensor = local_part(tensor)
    return tensor.numel() * tensor.element_size()


def module_bytes(model: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (a tied weight counted once)."""
    return sum(tensor_bytes(t) for t in itertools.chain(model.parameters(), model.buffers()))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: str | torch.device) -> int:
    """Move every state tensor of `optimizer` to `device`, in place; returns the bytes
    of the tensors placed there.

    In place, because the optimizer must go on stepping the same parameter objects
    after a park/unpark cycle (S-RUN-4); a state_dict round trip would rebuild it.
    Which tensors move is `optimizer_state_slots`' rule (a host-side `step` stays).
    """
    device = torch.device(device)
    moved = 0
    for _, state, key in optimizer_state_slots(optimizer):
        moved += tensor_bytes(state[key])
        state[key] = state[key].to(device)
    return moved


def targets_on(targets: PPOTargets, device: torch.device) -> PPOTargets:
    """The targets' per-token tensors (b, p + r) and (b, r) on the trainer's device,
    moved once per update rather than once per micro-batch.

    Extras (packed pixels) stay on the host: `model_io` moves only the rows of each
    micro-batch. On the host the very same object comes back, nothing copied, so a
    CPU run computes exactly what it computed before devices existed.
    """
    if device.type == "cpu":
        return targets
    moved = {
        f.name: value.to(device)
        for f in dataclasses.fields(targets)
        if isinstance(value := getattr(targets, f.name), torch.Tensor)
    }
    return dataclasses.replace(targets, **moved)


def build_optimizer(parameters, config: OptimizerConfig, lr: float) -> torch.optim.Optimizer:
    flavour = {
        "adamw": {"foreach": False, "fused": False},
        "adamw_foreach": {"foreach": True, "fused": False},
        "adamw_fused": {"foreach": False, "fused": True},
    }[config.name]
    return torch.optim.AdamW(
        parameters, lr=lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay, **flavour
    )


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _minibatch_diagnostics(per_micro: list[tuple[dict[str, torch.Tensor], float]]) -> dict[str, float]:
    """One minibatch's diagnostics (clip fraction, approx KL, ...) from its micro-batches'
    token means, weighted by their loss tokens: this rank's token mean over the
    minibatch, the same however it was cut. The loss itself is not here: `run_plan`
    reports the aggregated objective."""
    if len(per_micro) == 1:  # exactly the micro-batch's own figures, as before token budgets
        return {name: float(value) for name, value in per_micro[0][0].items() if name != "loss"}
    tokens = sum(count for _, count in per_micro) or 1.0
    names = [name for name in per_micro[0][0] if name != "loss"]
    return {name: sum(float(diagnostics[name]) * count for diagnostics, count in per_micro) / tokens
            for name in names}


class UpdateRuntime:
    def __init__(
        self,
        role: str,
        model: torch.nn.Module,
        optimizer_config: OptimizerConfig,
        lr: float,
        device: str | torch.device = "cpu",
    ):
        self.role = role
        self.device = resolve_device(device)  # where updates run; a parked trainer's state is elsewhere meanwhile
        if self.device.type != "cpu":
            # Before the optimizer exists, so its state is created beside the
            # parameters (fused and foreach kernels need both on one device).
            model.to(self.device)
        self.model = model
        self.optimizer_config = optimizer_config
        self.lr = lr
        self._build_optimizer()
        self.max_grad_norm = optimizer_config.max_grad_norm
        self.optimizer_step = 0
        self.plan_shape: PlanShape | None = None
        self.data_parallel: DataParallel = SINGLE
        self.last_grad_sync_seconds: float | None = None
        # Host <-> GPU moves (the colocated park) go through reused pinned buffers;
        # False takes the plain `Module.to` path (bench/park_bench.py compares them).
        self.pin_host_copies = True
        self._host_copies = PinnedHostCopies()

    def _build_optimizer(self) -> None:
        self.optimizer = build_optimizer(
            [p for p in self.model.parameters() if p.requires_grad], self.optimizer_config, self.lr
        )
        self.scheduler = build_scheduler(self.optimizer, self.optimizer_config.warmup_steps)

    def join_data_parallel(self, address: str, rank: int, world: int, shard: int | None = None) -> None:
        """Form this role's process group with its other ranks, take rank 0's weights
        and shard the model over the ranks, `shard` ranks per shard group (S-SCALE-1). The model must be on its
        compute device (NCCL needs GPU tensors) and never stepped: sharding replaces
        the parameters, so the optimizer and its scheduler are built anew."""
        if self.optimizer_step or self.optimizer.state:
            raise RuntimeError(f"{self.role}: joining a process group after training would drop optimizer state")
        self.data_parallel = join_group(address, rank, world, self.device)
        if self.data_parallel.active:
            self.data_parallel.broadcast_from_rank0(self.model)
            self.data_parallel.mesh = shard_model(self.model, world, self.device, shard)
            self._build_optimizer()
            self._host_copies = PinnedHostCopies()  # the full-size buffers of a park before sharding

    def run_plan(
        self, plan: UpdatePlan, targets: PPOTargets, loss_fn: LossFn, packed: bool = False
    ) -> dict[str, float]:
        """Every optimizer step of `plan` over `targets`. Each minibatch's loss is
        `rl.loss_aggregation` of its per-token losses: the normaliser is taken from the
        whole minibatch before the first backward, and each micro-batch adds its share,
        so the gradient does not depend on micro-batches, ranks or token-budget
        cutting (S-PATH-2); so does the reported loss (the objective itself) and the
        diagnostics (token-weighted within a minibatch, `_minibatch_diagnostics`).
        `packed`: `loss_fn` runs each micro-batch as one packed row (models/packed_rows.py),
        so its forward holds no padding slot."""
        if self.plan_shape is not None and self.plan_shape != plan.shape:
            raise ValueError(
                f"{self.role}: update plan {plan.shape} {SHAPE_NAMES} differs from "
                f"{self.plan_shape} this role was trained and checkpointed with"
            )
        dp = self.data_parallel
        aggregation = loss_aggregation(plan.loss_aggregation)
        # Cut first: a batch the plan cannot cut is refused before the role records
        # anything, so a failed update leaves it as it was (S-FLOW-6).
        schedule = plan.steps(
            targets.num_samples, dp.rank, dp.world, targets.attention_mask, targets.prompt_length,
            keep_prompt=bool(targets.extras),  # multimodal token types are aligned with the whole prompt
        )
        self.plan_shape = plan.shape
        host_targets, targets = targets, targets_on(targets, self.device)
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        slots = {"padding": 0, "all": 0}
        sharded = is_sharded(self.model)
        sync_seconds = 0.0
        for minibatch in schedule:
            self.optimizer.zero_grad(set_to_none=True)
            normaliser = aggregation.normaliser(targets.response_mask[minibatch.rows], plan.generation_budget)
            minibatch_loss = 0.0
            per_micro: list[tuple[dict[str, torch.Tensor], float]] = []
            for position, micro in enumerate(minibatch.micro_batches):
                last = position == len(minibatch.micro_batches) - 1
                set_gradient_sync(self.model, last)  # one reduce-scatter per optimizer step
                per_token, diagnostics = loss_fn(targets, micro)
                mask = micro.response(targets.response_mask)
                share = aggregation.share(per_token, mask, normaliser)
                backward_started = time.perf_counter()
                share.backward()
                if sharded and last:
                    sync_seconds += time.perf_counter() - backward_started
                minibatch_loss += float(share.detach())
                per_micro.append((diagnostics, float(mask.sum())))
                _, attention, _ = micro.sequences(
                    host_targets.input_ids, host_targets.attention_mask, host_targets.prompt_length
                )
                real = int(attention.sum())
                slots["all"] += real if packed else attention.numel()
                slots["padding"] += 0 if packed else attention.numel() - real
            # The reported loss is the objective itself, this rank's shares summed (every
            # rank's add up to the minibatch's loss); counted once per minibatch, on rank 0.
            sums["loss"] += minibatch_loss
            counts["loss"] += 1 if dp.rank == 0 else 0
            for name, value in _minibatch_diagnostics(per_micro).items():
                sums[name] += value
                counts[name] += 1
            if sharded:
                grad_norm = clip_gradients(list(self.model.parameters()), self.max_grad_norm)
            else:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer_step += 1
            sums["grad_norm"] += float(grad_norm)
            counts["grad_norm"] += 1
        sums["padding_slots"], sums["slots"] = float(slots["padding"]), float(slots["all"])
        if dp.active:
            dp.all_reduce_sums(sums, counts, self.device)
        # Over every rank's micro-batches: the padded share of the slots the forwards processed.
        padding_fraction = sums.pop("padding_slots") / max(sums.pop("slots"), 1.0)
        metrics = {name: sums[name] / counts[name] for name in sums}
        metrics["padding_fraction"] = padding_fraction
        metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        # Seconds this rank spent in the backward passes that reduce-scatter the
        # gradients (waiting for the slowest rank included), for the perf/ metrics.
        self.last_grad_sync_seconds = sync_seconds if sharded else None
        return metrics

    def place(self, device: str | torch.device) -> int:
        """Move the model (parameters, buffers, gradients) and the optimizer state to
        `device`; returns the bytes now there (on sharded ranks, this rank's shards).

        Between host and GPU, `Module.to` swaps each parameter's data, not the
        parameter object, so the optimizer goes on stepping the model's own
        parameters. Where it would not (a device with another tensor type, or torch's
        overwrite-on-conversion flag), the optimizer would silently step stale
        copies: refused instead.
        """
        device = resolve_device(device)
        current = next(self.model.parameters()).device
        # FSDP2 keeps views into each rank's shards: a sharded model moves through its
        # own `Module.to` (which re-points them), not the pinned buffers' `.data` swaps.
        if self.pin_host_copies and not is_sharded(self.model) and {current.type, device.type} == {"cpu", "cuda"}:
            return move_state(self.model, self.optimizer, device, self._host_copies)
        before = list(self.model.parameters())
        self.model.to(device)
        if any(old is not new for old, new in zip(before, self.model.parameters())):
            raise RuntimeError(
                f"{self.role}: moving the model to {device} replaced its parameter objects, so its optimizer "
                "would step stale copies; only host <-> GPU moves are supported"
            )
        return module_bytes(self.model) + move_optimizer_state(self.optimizer, device)

    def save(self, directory: str, extra_state: dict[str, Any]) -> RoleSaveReport:
        """On sharded ranks a collective: every rank writes its own shards (S-SCALE-2)."""
        trainer_state = {
            "optimizer_step": self.optimizer_step,
            "plan_shape": list(self.plan_shape) if self.plan_shape else None,
            **extra_state,
        }
        if is_sharded(self.model):
            from checkpoint.sharded_role import save_sharded_role  # see load()

            return save_sharded_role(
                directory, role=self.role, rank=self.data_parallel.rank, model=self.model,
                optimizer=self.optimizer, scheduler=self.scheduler, trainer_state=trainer_state,
                model_config_json=self.model.config.to_json_string(),
            )
        return save_trainable_role(
            directory, role=self.role, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            trainer_state=trainer_state,
        )

    def save_model(self, directory: str) -> str:
        """A weights-only artifact: sharded ranks gather the full weights (a
        collective), rank 0 writes them; a LoRA model writes its merged weights, so the
        artifact loads as a plain model (S-LORA-3)."""
        if not is_sharded(self.model) and not is_lora_model(self.model):
            return save_model_only(directory, model=self.model)
        # Sharded, or LoRA: the full weights, merged under the base model's names.
        tensors = full_weights(self.model, keep=self.data_parallel.rank == 0)
        if self.data_parallel.rank == 0:
            save_model_only(directory, model=self.model, tensors=tensors)
        return directory

    def load(self, directory: str) -> dict[str, Any]:
        """Either layout at any rank count: a sharded boundary (DCP) reshards to this
        role's ranks, a one-rank boundary is sliced into them (S-SCALE-2).

        The sharded layout's module is imported here, not with this one: it brings in
        torch.distributed.tensor and sympy, which the driver, importing the
        role classes to launch their actors, never uses. Role processes have it
        preloaded (processes/fork_server.py)."""
        from checkpoint.sharded_role import is_sharded_layout, load_sharded_role

        load = load_sharded_role if is_sharded_layout(directory) else load_trainable_role
        state = load(directory, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
        self.optimizer_step = int(state["optimizer_step"])
        self.plan_shape = held_shape(state["plan_shape"]) if state.get("plan_shape") else None
        return state
