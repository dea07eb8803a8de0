"""The frozen reference: log-probs of the sampled tokens under the initial model,
for the KL penalty in the reward. It scores on its own group's device (S-RUN-4: its
own GPU, or the host when `grid.reference_gpus=0`) and never parks.

With several ranks (one per GPU of its group, `grid.cpu_reference_ranks` on the
host) its model is sharded over them with FSDP2 like a trainer's (S-SCALE-1), but
frozen: no gradients, no optimizer state, so each rank holds 1/N of the weights and
nothing else. A sharded forward gathers each block from every rank, so every rank
scores the same batch; rank 0's log-probs go on."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from configs.schema import PPOConfig
from models.cut_forward import forward_by_tokens
from models.packed_rows import takes_packed_rows
from models.model_io import ensure_model, load_causal_lm, model_device, response_logprobs, use_attention
from placement.mesh import role_mesh
from placement.plan import plan_placement
from placement.role_placement import RolePlacement
from contracts.trajectory import Trajectory
from trainer.data_parallel import SINGLE, DataParallel, join_group, rendezvous_address
from trainer.runtime import configure_torch_threads
from trainer.sharding import is_sharded, shard_model


class ReferenceRole:
    def __init__(self, config: PPOConfig, placement: RolePlacement):
        configure_torch_threads(config.rl.threads_per_role)
        self.config = config
        self.temperature = config.rl.rollout.temperature
        self.rank = placement.rank
        self.device = placement.on_visible_device().device
        model = load_causal_lm(ensure_model(config.model), config.model.dtype)
        self.model = use_attention(model, config.model.attention)
        self.model.eval()
        if self.device != "cpu":
            self.model.to(self.device)
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        self.data_parallel: DataParallel = SINGLE
        # S-PATH-3: packed rows where the attention kernel takes them (models/packed_rows.py).
        self.packs_rows = config.rl.micro_batch_tokens is not None and takes_packed_rows(config.model.attention)

    def ready(self) -> dict[str, Any]:
        return {
            "role": "reference", "device": str(model_device(self.model)), "rank": self.rank,
            "ranks": self.data_parallel.world,
        }

    def rendezvous_address(self) -> str:
        """Rank 0's listening address for the reference's process group."""
        return rendezvous_address()

    def join_data_parallel(self, address: str, rank: int, world: int) -> dict[str, Any]:
        """Join the reference's process group (every rank at once) and shard the frozen
        model over the mesh the manifest printed (S-SCALE-1). Every rank loaded the same
        checkpoint, so no weights need to travel first."""
        mesh = role_mesh(plan_placement(self.config), "reference")
        device = torch.device(model_device(self.model))
        self.data_parallel = join_group(address, rank, world, device)
        if self.data_parallel.active:
            shard = mesh.shard if mesh.ranks == world else None
            self.data_parallel.mesh = shard_model(self.model, world, device, shard)
        return self.ready()

    @torch.no_grad()
    def score(self, trajectory: Trajectory) -> tuple[Trajectory, dict[str, float]]:
        input_ids, attention_mask = trajectory.sequences()
        ref_logprobs = forward_by_tokens(
            lambda ids, mask, prompt_length, rows: response_logprobs(
                self.model, ids, mask, prompt_length, self.temperature, trajectory.extras, rows, pack=self.packs_rows
            ),
            input_ids, attention_mask, trajectory.prompt_length, self.config.rl.micro_batch_tokens,
            keep_prompt=bool(trajectory.extras),
        ) * trajectory.response_mask  # on the host: the trajectory goes back to the object store
        if is_sharded(self.model):
            # FSDP2 leaves the root's own weights (embeddings, final norm) gathered after
            # a forward, expecting a backward; a frozen model never has one.
            self.model.reshard()
        return dataclasses.replace(trajectory, ref_logprobs=ref_logprobs), {}
