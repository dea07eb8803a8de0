"""What the two trainer roles (policy, critic) share: start-up on the placement the plan
gave them, joining their data-parallel group, the train-step guard and receipt
(S-FLOW-3, S-FLOW-5), and checkpoint save/load. Written once so the two cannot drift;
each subclass adds only its model, its loss and its own checks."""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict
from typing import Any, ClassVar, Iterator

import torch

from algorithm.update_plan import MicroBatch, UpdatePlan
from checkpoint.role_files import saving, write_file
from configs.schema import OptimizerConfig, PPOConfig
from models.packed_rows import takes_packed_rows
from models.lora import ADAPTER_CONFIG_FILE, adapter_config_json, is_lora_model, trainable_parameters
from placement.mesh import role_mesh
from placement.plan import plan_placement
from placement.role_placement import RolePlacement
from contracts.trajectory import PPOTargets, TrainReceipt
from trainer.data_parallel import rendezvous_address
from trainer.runtime import configure_torch_threads
from trainer.update_runtime import UpdateRuntime


class TrainerRole:
    role: ClassVar[str]  # "policy" | "critic": the receipt's role and every metric's prefix

    def __init__(self, config: PPOConfig, placement: RolePlacement):
        configure_torch_threads(config.rl.threads_per_role)
        self.config = config
        self.rl = config.rl
        self.rank = placement.rank
        # Resolved here, not in the driver: only the actor's process sees its GPU.
        self.placement = placement.on_visible_device()
        model = self._load_model(config)
        self.runtime = UpdateRuntime(
            self.role, model, config.rl.optimizer, self._learning_rate(config.rl.optimizer), self.placement.device
        )
        self.targets: PPOTargets | None = None
        # S-PATH-3: token-budget micro-batches run packed, without padding, where the
        # attention kernel takes packed rows (flash-attention's varlen on a GPU).
        self.packs_rows = config.rl.micro_batch_tokens is not None and takes_packed_rows(config.model.attention)

    def _load_model(self, config: PPOConfig) -> torch.nn.Module:
        raise NotImplementedError

    def _learning_rate(self, optimizer: OptimizerConfig) -> float:
        raise NotImplementedError

    def _loss(self, targets: PPOTargets, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-token loss (m, r') of one micro-batch and its diagnostics
        (trainer/update_runtime.py `LossFn`)."""
        raise NotImplementedError

    def _train_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The runtime's averaged loss diagnostics under this role's `train/*` names."""
        raise NotImplementedError

    @property
    def model(self) -> torch.nn.Module:
        return self.runtime.model

    def ready(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "trainable_parameters": trainable_parameters(self.model),
            "device": str(self.runtime.device),
            "rank": self.rank,
            "ranks": self.runtime.data_parallel.world,
        }

    def rendezvous_address(self) -> str:
        """Rank 0's listening address for its role's process group."""
        return rendezvous_address()

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        """Around work that needs the model on its device; a role that parks overrides it."""
        yield

    def join_data_parallel(self, address: str, rank: int, world: int) -> dict[str, Any]:
        """Join the role's process group (every rank at once), take rank 0's weights
        (the critic's value head included: each rank drew its own at start-up) and
        shard them over the role's mesh (S-SCALE-1)."""
        mesh = role_mesh(plan_placement(self.config), self.role)  # the mesh the manifest printed
        with self._on_device():  # NCCL broadcasts device tensors
            self.runtime.join_data_parallel(address, rank, world, mesh.shard if mesh.ranks == world else None)
        return self.ready()

    def install_targets(self, targets: PPOTargets) -> dict[str, str]:
        """Keep rank 0's frozen targets under their batch id, the key the controller
        hands back to train_batch (S-FLOW-3, S-FLOW-5)."""
        self.targets = targets
        return {"batch_id": targets.batch_id}

    def _admit(self, targets: PPOTargets, batch_id: str) -> None:
        """A subclass's own refusal of held targets, and what it does before updating."""

    def train_batch(self, plan: UpdatePlan, batch_id: str) -> TrainReceipt:
        if self.targets is None or self.targets.batch_id != batch_id:
            held = self.targets.batch_id if self.targets else None
            raise ValueError(f"{self.role} was asked to train on batch {batch_id} but holds targets for {held}")
        self._admit(self.targets, batch_id)
        started = time.perf_counter()
        metrics = self.runtime.run_plan(plan, self.targets, self._loss, packed=self.packs_rows)
        named = self._train_metrics(metrics)
        named[f"optim/{self.role}_lr"] = metrics["lr"]
        named[f"optim/{self.role}_optimizer_step"] = float(self.runtime.optimizer_step)
        named[f"perf/{self.role}_train_seconds"] = time.perf_counter() - started
        if self.runtime.last_grad_sync_seconds is not None:  # only with sharded ranks
            named[f"perf/{self.role}_grad_sync_seconds"] = self.runtime.last_grad_sync_seconds
        return TrainReceipt(self.role, batch_id, self.rank, self.runtime.optimizer_step, named)

    def _saved_state(self) -> dict[str, Any]:
        """What the role keeps beside its weights and optimizer in a boundary."""
        return {}

    def save(self, directory: str, plan: str = "full") -> dict[str, Any]:
        if plan == "model":
            return {"path": self.runtime.save_model(directory)}
        report = asdict(self.runtime.save(directory, self._saved_state()))
        if self.rank == 0 and is_lora_model(self.model):
            # PEFT's description of the adapters (rank, targets, the base model's path)
            # beside them: what the export rebuilds the model from (S-LORA-3).
            with saving(self.role, directory):
                write_file(f"{directory}/{ADAPTER_CONFIG_FILE}", adapter_config_json(self.model))
        return report

    def load(self, directory: str) -> dict[str, Any]:
        self.targets = None  # they belong to the state being replaced
        return self.runtime.load(directory)
