"""Whole-batch forwards (reference scoring, critic predictions, the policy's frozen
log-probs) cut the way the trainers cut their minibatches (`rl.micro_batch_tokens`,
S-PATH-3): length-grouped micro-batches of at most N real tokens, each trimmed to its
own longest row, so a batch of mostly short episodes is not padded to its longest.

Notation: b = rows of the batch, p + r = its padded prompt and response columns,
m = rows of one micro-batch, r' <= r its response columns after trimming.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from algorithm.token_budget import RowTooLong, cut_by_tokens
from algorithm.update_plan import MicroBatch, trimmed_micro_batch

# (ids (m, p' + r'), mask (m, p' + r'), p', rows (m,) or None for all) -> (m, r') per response token
ResponseForward = Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor | None], torch.Tensor]


def token_micro_batches(
    attention_mask: torch.Tensor, prompt_length: int, budget: int, keep_prompt: bool = False
) -> list[MicroBatch]:
    """The batch's rows as trimmed micro-batches of at most `budget` real tokens each,
    in a fixed order (`cut_by_tokens`), so every rank of a sharded model runs the same
    forwards in the same order."""
    return [
        trimmed_micro_batch(torch.tensor(group, dtype=torch.long), attention_mask, prompt_length, keep_prompt)
        for group in _groups(attention_mask.sum(dim=1).tolist(), budget)
    ]


def _groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """`cut_by_tokens`, its refusal naming the key to raise."""
    try:
        return cut_by_tokens(lengths, budget)
    except RowTooLong as error:
        raise RowTooLong(f"rl.micro_batch_tokens: {error}; raise rl.micro_batch_tokens to hold it") from None


def forward_by_tokens(
    forward: ResponseForward,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    budget: int | None,
    keep_prompt: bool = False,
) -> torch.Tensor:
    """`forward` over the whole batch (b, r) on the host, in token-budget micro-batches;
    zero past each micro-batch's trimmed width. `budget` None makes the one call over
    the whole, untrimmed batch that was made before budgets existed (bit for bit).

    Args:
        input_ids, attention_mask: (b, p + r), prompts left-padded, responses right-padded.
        prompt_length: p.
        keep_prompt: keep every prompt column (multimodal rows: their token types are
            laid out over the whole prompt).
    """
    if budget is None:
        return forward(input_ids, attention_mask, prompt_length, None).cpu()
    result = torch.zeros(input_ids.shape[0], input_ids.shape[1] - prompt_length)
    for micro in token_micro_batches(attention_mask, prompt_length, budget, keep_prompt):
        ids, mask, micro_prompt_length = micro.sequences(input_ids, attention_mask, prompt_length)
        part = forward(ids, mask, micro_prompt_length, micro.rows).cpu()
        result[micro.rows, : part.shape[1]] = part.to(result.dtype)
    return result


def cut_lengths_by_tokens(lengths: Sequence[int], budget: int | None, rows_per_forward: int) -> list[list[int]]:
    """Positions of texts of `lengths` tokens, grouped for one forward each: by the token
    budget when there is one, else `rows_per_forward` at a time, in order."""
    if budget is None:
        return [list(range(start, min(start + rows_per_forward, len(lengths))))
                for start in range(0, len(lengths), rows_per_forward)]
    return _groups(lengths, budget)
