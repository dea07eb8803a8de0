"""Cutting rows into micro-batches of at most N tokens (`rl.micro_batch_tokens`, S-PATH-3),
and trimming a micro-batch to its own longest row.

A row's tokens are its real tokens, prompt and response (the sum of its attention
mask): the count a packed forward would process, independent of how the batch was
padded. A micro-batch holds rows whose tokens add up to at most the budget; the
padded forward of a trimmed micro-batch can be a little wider than that sum, and
`perf/padding_fraction` reports how much.

Pure and deterministic, so every whole-batch forward (training, reference scoring,
critic predictions) can cut the same way.
"""

from __future__ import annotations

from typing import Sequence

import torch

from contracts.faults import RepeatsOnRerun


class RowTooLong(ValueError, RepeatsOnRerun):
    """A single row holds more tokens than the budget: the same batch would fail the
    same way on a rerun, so the run ends naming the key to raise, not with the resume
    hint (S-BYO-3)."""


def cut_by_tokens(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Positions into `lengths`, grouped into micro-batches of at most `budget` tokens.

    Rows are taken shortest first (ties by position), and each micro-batch is filled
    until the next row would overflow it, so rows of similar length share a
    micro-batch and little of it is padding. Every position appears exactly once.

    >>> cut_by_tokens([5, 3, 9, 3], 10)
    [[1, 3], [0], [2]]
    """
    if budget < 1:
        raise ValueError(f"token budget must be at least 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda position: (int(lengths[position]), position))
    groups: list[list[int]] = []
    held = 0
    for position in order:
        length = int(lengths[position])
        if length > budget:
            raise RowTooLong(f"row {position} holds {length} tokens, more than the budget of {budget}")
        if groups and held + length <= budget:
            groups[-1].append(position)
            held += length
        else:
            groups.append([position])
            held = length
    return groups


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """`groups` split until there are `count` of them: the group with the most rows
    (the first such) is halved, again and again. Each part stays within the budget its
    group kept. Data-parallel ranks run the same number of forwards (a sharded model
    gathers its weights in each), so every rank cuts into the most any rank needs.

    >>> split_to([[1, 3, 0], [2]], 3)
    [[1], [3, 0], [2]]
    """
    rows = sum(len(group) for group in groups)
    if not len(groups) <= count <= rows:
        raise ValueError(f"cannot split {len(groups)} groups of {rows} rows into {count}")
    groups = [list(group) for group in groups]
    while len(groups) < count:
        widest = max(range(len(groups)), key=lambda index: (len(groups[index]), -index))
        group = groups[widest]
        half = len(group) // 2
        groups[widest : widest + 1] = [group[:half], group[half:]]
    return groups


def trimmed_columns(attention_mask: torch.Tensor, prompt_length: int, keep_prompt: bool = False) -> tuple[int, int]:
    """The columns a micro-batch needs: `(first, response_length)`.

    Prompts are left-padded and responses right-padded (models/model_io.py), so the
    leading prompt columns and the trailing response columns that are padding in every
    row can go. Positions count real tokens only (`position_ids_for`), so dropping
    them changes no position; the response then starts at `prompt_length - first`.

    Args:
        attention_mask: (m, p + r) of the micro-batch's rows.
        prompt_length: p.
        keep_prompt: keep every prompt column (multimodal rows: their token types are
            aligned with the whole prompt).

    Returns:
        first, the number of leading columns to drop (0..p-1: one prompt column always
        stays, it predicts the first response token), and response_length, the
        response columns to keep (at least 1).
    """
    real = attention_mask.bool()
    prompt, response = real[:, :prompt_length], real[:, prompt_length:]
    first = 0
    if not keep_prompt:
        used = prompt.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else prompt_length
        first = min(first, prompt_length - 1)
    used = response.any(dim=0).nonzero()
    response_length = int(used[-1]) + 1 if len(used) else 1
    return first, response_length
