"""Synthetic prompt sets made in-process, used through `rl.data.factory`.

They exist because no dataset can be downloaded here and because a learning demo
from a random start needs a task a tiny model can learn in minutes, such as copying a
digit (docs/performance.md, "The CPU profile", has its curve).
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


REVERSE_PROMPT = "reverse "  # the words before the digits; the tokenizer needs its characters


def is_heldout_digits(digits: str) -> bool:
    """About one digit string in ten is never trained on (as `is_heldout_sum`)."""
    return zlib.crc32(digits.encode()) % 10 == 0


def _reversal_rows(num_rows: int, seed: int, min_digits: int, max_digits: int, heldout: bool) -> Iterator[dict]:
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits (got {min_digits}, {max_digits})")
    rng = random.Random(seed)
    produced = 0
    while produced < num_rows:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(min_digits, max_digits)))
        if is_heldout_digits(digits) == heldout:
            produced += 1
            yield {"prompt": REVERSE_PROMPT + digits, "reference": digits[::-1]}


def reverse_digits_split(
    num_rows: int = 1000, seed: int = 0, min_digits: int = 8, max_digits: int = 16, split: str = "train"
) -> Iterator[dict]:
    """Prompt "reverse 8472019355", reference "5539102748": a digit string of uniformly
    drawn length, from one side of the fixed train/held-out partition
    (`is_heldout_digits`). Long answers on purpose: generating them is the larger part
    of an iteration on a CPU."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout' (got {split!r})")
    return _reversal_rows(num_rows, seed, min_digits, max_digits, heldout=split == "heldout")


def heldout_reversals(num_rows: int = 256, seed: int = 1, min_digits: int = 8, max_digits: int = 16) -> list[dict]:
    """A fixed sample of held-out digit strings, the evaluation set (the held-out side
    has too many strings to list them all, unlike `heldout_sums`)."""
    return list(_reversal_rows(num_rows, seed, min_digits, max_digits, heldout=True))


# A bare question, and one that says to look the key up. Both end with the key, so the
# key stands as far from where the tool call writes it in either; the tokenizer needs
# their characters (model.tiny.task_alphabet).
KEY_QUESTION, LOOK_UP_REQUEST = "value of {key}", "look up {key}"
LOOK_UP_SHARE = 0.25  # of the rows, on both sides of the split
# A key's first letter is one of A-M, its second one of N-Z: each is then the only
# letter of its half in the episode, which a small model learns to copy much sooner
# than two letters drawn alike (docs/performance.md, "Tool use").
KEY_FIRST, KEY_SECOND = "ABCDEFGHIJKLM", "NOPQRSTUVWXYZ"


def is_heldout_key(key: str) -> bool:
    """About one key in ten is never trained on (as `is_heldout_sum`)."""
    return zlib.crc32(f"key {key}".encode()) % 10 == 0


def is_heldout_value(value: str) -> bool:
    """About one value in ten is never trained on: a held-out episode asks for an
    unseen key and must copy back an unseen value."""
    return zlib.crc32(f"value {value}".encode()) % 10 == 0


def key_lookup_split(num_rows: int = 1000, seed: int = 0, split: str = "train") -> Iterator[dict]:
    """Prompt "value of GN" (or, in a quarter of the rows, "look up GN"), reference
    "493", key "GN" (the data role hands a row's other keys to the environment as
    `EnvRow.metadata`). The value is drawn afresh for every row and never written in
    the prompt, so only the environment's `get` tool can tell it
    (environments/key_lookup.py). Keys are two capital letters, values three digits;
    each side of the split draws from its own keys and its own values
    (`is_heldout_key`, `is_heldout_value`)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout' (got {split!r})")
    heldout = split == "heldout"
    keys = [a + b for a in KEY_FIRST for b in KEY_SECOND if is_heldout_key(a + b) == heldout]
    values = [str(v) for v in range(100, 1000) if is_heldout_value(str(v)) == heldout]
    rng = random.Random(seed)
    for _ in range(num_rows):
        key, value = rng.choice(keys), rng.choice(values)
        prompt = LOOK_UP_REQUEST if rng.random() < LOOK_UP_SHARE else KEY_QUESTION
        yield {"prompt": prompt.format(key=key), "reference": value, "key": key}
