"""How a per-token loss becomes one minibatch's number (`rl.loss_aggregation`, S-PATH-2).

Notation: M = sequences in the whole minibatch (every micro-batch, every rank),
m = sequences in one micro-batch, r = response length (padded, possibly trimmed).

Each aggregation is two pure functions. `normaliser` is computed once per minibatch,
from the loss mask of the *whole* minibatch, before the first backward: every rank
holds the whole batch's targets and draws the same shuffle, so no collective is
needed. `share` turns one micro-batch's per-token loss into its part of the
minibatch's loss, so that the shares summed over micro-batches and ranks are the
minibatch's loss whatever the cutting: a micro-batch is a way to compute, never part
of the objective. The formulas are in docs/reference/loss-aggregation.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def sequences_with_tokens(mask: torch.Tensor) -> torch.Tensor:
    """Rows of `mask` (M, r) holding at least one loss token, at least 1: the sequence
    count the `sequence_mean_*` aggregations average over."""
    return (mask.sum(dim=1) > 0).sum().to(mask.dtype).clamp(min=1.0)


def _token_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (per_token * mask).sum()


@dataclass(frozen=True)
class LossAggregation:
    name: str
    # (M, r) loss mask of the whole minibatch, the generation budget -> 0-dim normaliser.
    normaliser: Callable[[torch.Tensor, int], torch.Tensor]
    # per-token loss (m, r), mask (m, r), normaliser -> this micro-batch's share (0-dim).
    share: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    formula: str  # one line for the docs and the config reference


def _token_mean_share(per_token: torch.Tensor, mask: torch.Tensor, normaliser: torch.Tensor) -> torch.Tensor:
    # With one micro-batch this is `masked_mean` to the bit: the loss before S-PATH-2.
    return _token_sum(per_token, mask) / normaliser


def _sequence_mean_token_mean_share(
    per_token: torch.Tensor, mask: torch.Tensor, normaliser: torch.Tensor
) -> torch.Tensor:
    per_sequence = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (m,)
    return per_sequence.sum() / normaliser


LOSS_AGGREGATIONS: dict[str, LossAggregation] = {
    aggregation.name: aggregation
    for aggregation in (
        LossAggregation(
            "token_mean",
            normaliser=lambda mask, budget: mask.sum().clamp(min=1.0),
            share=_token_mean_share,
            formula="sum over sequences i and tokens t of l[i,t] / (loss tokens of the minibatch)",
        ),
        LossAggregation(
            "sequence_mean_token_mean",
            normaliser=lambda mask, budget: sequences_with_tokens(mask),
            share=_sequence_mean_token_mean_share,
            formula="(1/M) sum over sequences i of (sum over t of l[i,t] / loss tokens of i)",
        ),
        LossAggregation(
            "sequence_mean_token_sum",
            normaliser=lambda mask, budget: sequences_with_tokens(mask),
            share=_token_mean_share,
            formula="(1/M) sum over sequences i of (sum over t of l[i,t])",
        ),
        LossAggregation(
            "sequence_mean_token_sum_norm",
            normaliser=lambda mask, budget: sequences_with_tokens(mask) * budget,
            share=_token_mean_share,
            formula="(1/M) sum over sequences i of (sum over t of l[i,t]) / C, C the generation budget (Dr. GRPO)",
        ),
    )
}
"""Every `rl.loss_aggregation`; M is the number of sequences of the minibatch with at
least one loss token. configs/schema.py's Literal lists the same names (tested)."""


def loss_aggregation(name: str) -> LossAggregation:
    """The registered aggregation called `name`; an unknown name lists the known ones."""
    try:
        return LOSS_AGGREGATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown loss aggregation {name!r}; known: {', '.join(LOSS_AGGREGATIONS)}"
        ) from None
