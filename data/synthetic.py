"""Synthetic prompt sets made in-process, used through `rl.data.factory`.

They exist because no dataset can be downloaded here and because a learning demo
from a random start needs a task a tiny model can learn in minutes: copying a digit
(measured: reward 0.04 -> 0.99 in about 240 PPO updates on this CPU).
"""

from __future__ import annotations

import random
from typing import Iterator


def copy_digit(num_rows: int = 1000, seed: int = 0) -> Iterator[dict]:
    """Prompt "7", reference "7": the completion must be exactly the digit."""
    rng = random.Random(seed)
    for _ in range(num_rows):
        digit = str(rng.randrange(10))
        yield {"prompt": digit, "reference": digit}


def addition(num_rows: int = 1000, seed: int = 0, max_operand: int = 9) -> Iterator[dict]:
    """Prompt "3+4=", reference "7"."""
    rng = random.Random(seed)
    for _ in range(num_rows):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        yield {"prompt": f"{a}+{b}=", "reference": str(a + b)}
