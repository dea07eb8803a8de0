"""The update runtime both trainable roles share: optimizer, scheduler, the
epoch × minibatch × micro-batch loop of the update plan, and role checkpoints.

Policy and critic differ only in the loss they hand to `run_plan`; everything
about *how* an update happens lives here once.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch

from algorithm.update_plan import UpdatePlan
from checkpoint.role_state import RoleSaveReport, load_trainable_role, save_model_only, save_trainable_role
from configs.schema import OptimizerConfig
from roles.trajectory import PPOTargets

LossFn = Callable[[PPOTargets, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


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


class UpdateRuntime:
    def __init__(self, role: str, model: torch.nn.Module, optimizer_config: OptimizerConfig, lr: float):
        self.role = role
        self.model = model
        self.optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], optimizer_config, lr)
        self.scheduler = build_scheduler(self.optimizer, optimizer_config.warmup_steps)
        self.max_grad_norm = optimizer_config.max_grad_norm
        self.optimizer_step = 0
        self.plan_shape: tuple[int, int, int] | None = None

    def run_plan(self, plan: UpdatePlan, targets: PPOTargets, loss_fn: LossFn) -> dict[str, float]:
        if self.plan_shape is not None and tuple(self.plan_shape) != plan.shape:
            raise ValueError(
                f"{self.role}: update plan shape {plan.shape} (epochs, minibatch, micro-batch) differs from "
                f"{tuple(self.plan_shape)} this role was trained and checkpointed with (S-FLOW-4)"
            )
        self.plan_shape = plan.shape
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for minibatch in plan.minibatches(targets.num_samples):
            minibatch_size = sum(len(micro) for micro in minibatch)
            self.optimizer.zero_grad(set_to_none=True)
            for micro in minibatch:
                loss, diagnostics = loss_fn(targets, micro)
                (loss * (len(micro) / minibatch_size)).backward()
                for name, value in diagnostics.items():
                    sums[name] += float(value)
                    counts[name] += 1
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer_step += 1
            sums["grad_norm"] += float(grad_norm)
            counts["grad_norm"] += 1
        metrics = {name: sums[name] / counts[name] for name in sums}
        metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        return metrics

    def save(self, directory: str, extra_state: dict[str, Any]) -> RoleSaveReport:
        return save_trainable_role(
            directory,
            role=self.role,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            trainer_state={
                "optimizer_step": self.optimizer_step,
                "plan_shape": list(self.plan_shape) if self.plan_shape else None,
                **extra_state,
            },
        )

    def save_model(self, directory: str) -> str:
        return save_model_only(directory, model=self.model)

    def load(self, directory: str) -> dict[str, Any]:
        state = load_trainable_role(directory, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
        self.optimizer_step = int(state["optimizer_step"])
        self.plan_shape = tuple(state["plan_shape"]) if state.get("plan_shape") else None
        return state
