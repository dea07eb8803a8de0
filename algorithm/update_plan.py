"""The update plan: one object that both trainable roles receive each iteration.

Deciding the epoch × minibatch schedule in one place keeps policy and critic on the
same sample order (S-FLOW-3/4). The shuffle is seeded by the run seed plus the
*outer iteration*, never by an optimizer-step counter, so during critic warmup (when
the policy does not step) the critic's minibatches still move (S-CW-4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class UpdatePlan:
    epochs: int
    minibatch_size: int
    micro_batch_size: int
    seed: int
    outer_iteration: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """The part of the plan a checkpoint is bound to: resuming under a different
        shape would silently change the optimisation, so restore refuses it."""
        return (self.epochs, self.minibatch_size, self.micro_batch_size)

    def minibatches(self, num_samples: int, rank: int = 0, ranks: int = 1) -> list[list[torch.Tensor]]:
        """Per epoch, the list of minibatch index tensors, each split into
        micro-batches: `plan[epoch][minibatch] -> list[(m,) index tensor]`.

        With data parallelism every rank draws the same shuffle and takes its own
        contiguous slice of each minibatch (`minibatch_size / ranks` samples); the
        slices of all ranks together are exactly the one-rank minibatch, so the
        summed gradients are the one-rank gradient (S-FLOW-5)."""
        if num_samples % self.minibatch_size:
            raise ValueError(
                f"batch of {num_samples} samples is not a multiple of the minibatch size {self.minibatch_size}"
            )
        if self.minibatch_size % ranks:
            raise ValueError(f"minibatch size {self.minibatch_size} does not split into {ranks} equal rank shards")
        shard = self.minibatch_size // ranks
        schedule: list[list[torch.Tensor]] = []
        for epoch in range(self.epochs):
            generator = torch.Generator().manual_seed(self._epoch_seed(epoch))
            order = torch.randperm(num_samples, generator=generator)
            for start in range(0, num_samples, self.minibatch_size):
                minibatch = order[start : start + self.minibatch_size][rank * shard : (rank + 1) * shard]
                schedule.append(list(torch.split(minibatch, self.micro_batch_size)))
        return schedule

    def _epoch_seed(self, epoch: int) -> int:
        return (self.seed * 1_000_003 + self.outer_iteration * 10_007 + epoch) % (2**63)

