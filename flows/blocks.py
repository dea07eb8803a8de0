"""Blocks of iterations, the level between a run and its stage tasks in the Prefect UI
(S-OPS-1): each block is a subflow run (flows/flow_runner.py), aligned to multiples of
the block size so a block's name means the same iterations in every attempt of a run.
"""

from __future__ import annotations

from contracts.stage_names import BLOCK_FLOW

__all__ = ["BLOCK_FLOW", "block_name", "iteration_blocks"]


def iteration_blocks(start: int, last: int, size: int) -> list[tuple[int, int]]:
    """The blocks `(first, last)` covering iterations `start..last`, each inside one
    aligned window `(k-1)*size+1 .. k*size`."""
    if size < 1:
        raise ValueError(f"block size must be at least 1, got {size}")
    blocks = []
    first = start
    while first <= last:
        window_end = ((first - 1) // size + 1) * size
        blocks.append((first, min(window_end, last)))
        first = window_end + 1
    return blocks


def block_name(first: int, last: int) -> str:
    return f"iteration {first}" if first == last else f"iterations {first}-{last}"
