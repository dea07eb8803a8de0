"""Synthetic prompt sets made in-process, used through `rl.data.factory`.

They exist because no dataset can be downloaded here and because a learning demo
from a random start needs a task a tiny model can learn in minutes: copying a digit
(measured: reward 0.04 -> 0.99 in about 240 PPO updates on this CPU).
"""

from __future__ import annotations

import random
import zlib
from typing import Iterator


def copy_digit(num_rows: int = 1000, seed: int = 0) -> Iterator[dict]:
    """Prompt "7", reference "7": the completion must be exactly the digit."""
    rng = random.Random(seed)
    for _ in range(num_rows):
        digit = str(rng.randrange(10))
        yield {"prompt": digit, "reference": digit}


def each_digit() -> Iterator[dict]:
    """Every copy-digit prompt once, "0" to "9": the copy task's evaluation set. Ten
    prompts are the task's whole prompt space, so nothing can be held out of training;
    greedy decoding on each of them shows what the policy has learned, free of the
    rollout's sampling noise."""
    for digit in "0123456789":
        yield {"prompt": digit, "reference": digit}


def addition(num_rows: int = 1000, seed: int = 0, max_operand: int = 9) -> Iterator[dict]:
    """Prompt "3+4=", reference "7"."""
    rng = random.Random(seed)
    for _ in range(num_rows):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        yield {"prompt": f"{a}+{b}=", "reference": str(a + b)}


def is_heldout_sum(a: int, b: int) -> bool:
    """About one operand pair in ten is never trained on (neither pre-training nor
    PPO), so evaluation measures what was learned, not what was recalled. A hash, not
    a rule on the digits: a digit rule would hide whole carry patterns from training."""
    return zlib.crc32(f"{a}+{b}".encode()) % 10 == 0


def addition_split(
    num_rows: int = 1000, seed: int = 0, max_operand: int = 99, split: str = "train"
) -> Iterator[dict]:
    """Prompt "34+58=", reference "92", drawn uniformly from one side of the fixed
    train/held-out partition of operand pairs (`is_heldout_sum`)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout' (got {split!r})")
    rng = random.Random(seed)
    produced = 0
    while produced < num_rows:
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        if is_heldout_sum(a, b) == (split == "heldout"):
            produced += 1
            yield {"prompt": f"{a}+{b}=", "reference": str(a + b)}


def heldout_sums(max_operand: int = 99) -> list[dict]:
    """Every held-out operand pair once, in a fixed order: the evaluation set."""
    return [
        {"prompt": f"{a}+{b}=", "reference": str(a + b)}
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
        if is_heldout_sum(a, b)
    ]
