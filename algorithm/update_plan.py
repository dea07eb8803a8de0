"""The update plan: one object that both trainable roles receive each iteration.

Deciding the epoch × minibatch schedule in one place keeps policy and critic on the
same sample order (S-FLOW-3/4). The shuffle is seeded by the run seed plus the
*outer iteration*, never by an optimizer-step counter, so during critic warmup (when
the policy does not step) the critic's minibatches still move (S-CW-4).

Notation: b = samples in the batch, M = in one minibatch (all ranks), m = in one
micro-batch, p + r = the padded prompt and response columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from algorithm.token_budget import RowTooLong, cut_by_tokens, split_to, trimmed_columns

PlanShape = tuple[Any, ...]  # (epochs, minibatch size, micro-batch size, loss aggregation)

SHAPE_NAMES = "(epochs, minibatch, micro-batch, loss aggregation)"

LEGACY_AGGREGATION = "token_mean"
"""How a 3-element shape (a boundary written before `rl.loss_aggregation`) reads. With
one micro-batch per minibatch (every CPU profile) the old loss was exactly this; with
several (the public GPU profile) it averaged the micro-batches' token means, of which
this is the cut-independent form."""


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward: rows of the batch, and the columns they need.

    Without a token budget the columns are all of them and the slices below return the
    very rows today's code indexed (bit for bit). With one, the leading prompt columns
    and trailing response columns that are padding in every row are dropped."""

    rows: torch.Tensor  # (m,) indices into the batch
    first_column: int = 0  # leading prompt columns dropped
    response_length: int | None = None  # response columns kept; None: all

    @property
    def trimmed(self) -> bool:
        return self.first_column > 0 or self.response_length is not None

    def sequences(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(b, p + r) ids and mask -> this micro-batch's (m, p' + r') and p'."""
        ids, mask = input_ids[self.rows], attention_mask[self.rows]
        if not self.trimmed:
            return ids, mask, prompt_length
        end = prompt_length + (self.response_length or ids.shape[1] - prompt_length)
        return ids[:, self.first_column : end], mask[:, self.first_column : end], prompt_length - self.first_column

    def response(self, tensor: torch.Tensor) -> torch.Tensor:
        """A per-response-token tensor (b, r) -> (m, r')."""
        rows = tensor[self.rows]
        return rows if self.response_length is None else rows[:, : self.response_length]


def trimmed_micro_batch(
    rows: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int, keep_prompt: bool = False
) -> MicroBatch:
    """Rows (m,) of a batch whose mask is `attention_mask` (b, p + r), as a micro-batch
    trimmed to the columns they use (`trimmed_columns`): the one rule for the trainers'
    micro-batches and the whole-batch forwards (models/cut_forward.py)."""
    first, response_length = trimmed_columns(attention_mask[rows], prompt_length, keep_prompt)
    return MicroBatch(rows, first, response_length)


@dataclass(frozen=True)
class Minibatch:
    """One optimizer step: the whole minibatch's rows (every rank's share, for the loss
    normaliser) and this rank's micro-batches."""

    rows: torch.Tensor  # (M,)
    micro_batches: list[MicroBatch] = field(default_factory=list)


@dataclass(frozen=True)
class UpdatePlan:
    epochs: int
    minibatch_size: int
    micro_batch_size: int
    seed: int
    outer_iteration: int
    micro_batch_tokens: int | None = None  # S-PATH-3: cut by tokens instead of by micro_batch_size
    loss_aggregation: str = "token_mean"  # S-PATH-2, algorithm/loss_aggregation.py
    generation_budget: int = 1  # the constant C of sequence_mean_token_sum_norm

    @classmethod
    def from_config(cls, rl: Any, seed: int, outer_iteration: int) -> "UpdatePlan":
        """The plan of `rl` (an RLConfig) for one outer iteration."""
        return cls(
            rl.epochs, rl.minibatch_size, rl.micro_batch_size, seed, outer_iteration,
            micro_batch_tokens=rl.micro_batch_tokens, loss_aggregation=rl.loss_aggregation,
            generation_budget=rl.generation_budget,
        )

    @property
    def shape(self) -> PlanShape:
        """The part of the plan a checkpoint is bound to: resuming under a different
        shape would silently change the optimisation, so restore refuses it. The loss
        aggregation is the objective itself. `micro_batch_tokens` is not here: it
        changes how a minibatch is computed, not its gradient (S-PATH-2)."""
        return (self.epochs, self.minibatch_size, self.micro_batch_size, self.loss_aggregation)

    def minibatches(self, num_samples: int, rank: int = 0, ranks: int = 1) -> list[list[torch.Tensor]]:
        """Per epoch, the list of minibatch index tensors, each split into
        micro-batches of `micro_batch_size`: `plan[epoch][minibatch] -> list[(m,) index tensor]`."""
        return [[micro.rows for micro in step.micro_batches] for step in self._cut(num_samples, rank, ranks)]

    def steps(
        self,
        num_samples: int,
        rank: int = 0,
        ranks: int = 1,
        attention_mask: torch.Tensor | None = None,
        prompt_length: int | None = None,
        keep_prompt: bool = False,
    ) -> list[Minibatch]:
        """Every optimizer step of the plan, in order, with this rank's micro-batches.

        With data parallelism every rank draws the same shuffle and takes its own
        contiguous slice of each minibatch (`minibatch_size / ranks` samples); the
        slices of all ranks together are exactly the one-rank minibatch, so the
        summed gradients are the one-rank gradient (S-FLOW-5).

        With `micro_batch_tokens`, each rank's slice is cut by `cut_by_tokens` over the
        rows' real tokens (attention_mask (b, p + r) sums) and each micro-batch trimmed
        to its own rows (S-PATH-3); the minibatches are the same either way.
        """
        schedule = self._cut(num_samples, rank, ranks)
        if self.micro_batch_tokens is None:
            return schedule
        if attention_mask is None or prompt_length is None:
            raise ValueError("cutting by rl.micro_batch_tokens needs the batch's attention mask and prompt length")
        lengths = attention_mask.sum(dim=1).tolist()
        longest = max(range(len(lengths)), key=lambda row: lengths[row])
        if lengths[longest] > self.micro_batch_tokens:
            raise RowTooLong(
                f"rl.micro_batch_tokens is {self.micro_batch_tokens}, but row {longest} of the batch holds "
                f"{int(lengths[longest])} tokens (prompt and response); raise rl.micro_batch_tokens to at least that"
            )
        cut = []
        size = self.minibatch_size // ranks
        for step in schedule:
            shards = [step.rows[other * size : (other + 1) * size] for other in range(ranks)]
            budget = self.micro_batch_tokens
            groups = [cut_by_tokens([lengths[row] for row in each.tolist()], budget) for each in shards]
            # Every rank runs as many micro-batches as the rank that needs the most (a
            # sharded forward is a collective); each rank computes them all, no message.
            shard, mine = shards[rank], split_to(groups[rank], max(len(each) for each in groups))
            micro_batches = [
                trimmed_micro_batch(shard[positions], attention_mask, prompt_length, keep_prompt) for positions in mine
            ]
            cut.append(Minibatch(step.rows, micro_batches))
        return cut

    def _cut(self, num_samples: int, rank: int, ranks: int) -> list[Minibatch]:
        if num_samples % self.minibatch_size:
            raise ValueError(
                f"batch of {num_samples} samples is not a multiple of the minibatch size {self.minibatch_size}"
            )
        if self.minibatch_size % ranks:
            raise ValueError(f"minibatch size {self.minibatch_size} does not split into {ranks} equal rank shards")
        shard = self.minibatch_size // ranks
        schedule: list[Minibatch] = []
        for epoch in range(self.epochs):
            generator = torch.Generator().manual_seed(self._epoch_seed(epoch))
            order = torch.randperm(num_samples, generator=generator)
            for start in range(0, num_samples, self.minibatch_size):
                whole = order[start : start + self.minibatch_size]
                mine = whole[rank * shard : (rank + 1) * shard]
                micro_batches = [MicroBatch(rows) for rows in torch.split(mine, self.micro_batch_size)]
                schedule.append(Minibatch(whole, micro_batches))
        return schedule

    def _epoch_seed(self, epoch: int) -> int:
        return (self.seed * 1_000_003 + self.outer_iteration * 10_007 + epoch) % (2**63)


def held_shape(saved: Sequence[Any]) -> PlanShape:
    """A shape as a boundary recorded it, in today's form: boundaries written before
    `rl.loss_aggregation` hold (epochs, minibatch, micro-batch) only."""
    saved = tuple(saved)
    return saved + (LEGACY_AGGREGATION,) if len(saved) == 3 else saved

