"""Blocks of iterations: the level between a run and its stage tasks in the Prefect UI.

One flow run holding every stage task of a long run outgrows the server's graph
(blank past 10,000 nodes, S-OPS-1), so the `ppo` flow runs its iterations as one
subflow run per block of `job.iterations_per_block` (flows/flow_runner.py): the run's
graph holds one node per block, each block's graph its iterations' stage tasks.

Blocks are aligned to multiples of the block size (`iterations 1-50`, `51-100`), so a
block's name means the same iterations in every attempt of a run; a run that resumes
mid-block starts its first block at the resume iteration (`iterations 37-50`).
"""

from __future__ import annotations

BLOCK_FLOW = "ppo-iterations"


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
