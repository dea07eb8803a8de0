"""Brief supervised pre-training of the tiny model on synthetic arithmetic or reversal.

PPO post-trains a model that already half-knows its task; from a random start a tiny
model does not discover multi-digit addition by sampling. So it is born with a short
next-token pass over the *training* side of its task's split, formatted as the rollout
will see it; held-out items are never trained on, so PPO's gain on them starts honest.
Deterministic (fixed seed, one thread, fixed order): the same spec gives the same bytes.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch

from data.packing import as_conversation
from data.synthetic import addition_split, reverse_digits_split


@dataclass(frozen=True)
class PretrainReport:
    task: str
    steps: int
    examples: int
    first_loss: float
    last_loss: float
    seconds: float


def pretrain_rows(
    task: str,
    num_rows: int,
    seed: int,
    max_operand: int,
    min_digits: int = 8,
    max_digits: int = 16,
    period_fraction: float = 0.0,
) -> list[dict]:
    if task == "addition":
        return list(addition_split(num_rows, seed=seed, max_operand=max_operand, split="train"))
    if task == "reverse":
        rows = reverse_digits_split(num_rows, seed=seed, min_digits=min_digits, max_digits=max_digits)
        return with_trailing_period(list(rows), period_fraction, seed)
    raise ValueError(f"model.tiny.pretrain_task={task!r} has no pre-training data (accepted: addition, reverse)")


def with_trailing_period(rows: list[dict], fraction: float, seed: int) -> list[dict]:
    """A seeded share of the answers end with a period: the habit a base model brings
    (sentences end with one) and an exact-match reward counts as wrong."""
    habit = random.Random(f"period-{seed}")
    return [
        {**row, "reference": row["reference"] + "."} if habit.random() < fraction else row for row in rows
    ]


def encode_examples(tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (n, t) input ids, attention mask and labels; labels are -100 except
    on the answer and its EOS, so the model learns to answer, not to write prompts.

    Prompts use the chat template with the generation prompt, exactly as
    `data.packing.ChatTextPacker` packs them for the rollout.
    """
    sequences, label_rows = [], []
    for row in rows:
        prompt = tokenizer.apply_chat_template(
            as_conversation(row["prompt"]), add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(row["reference"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        sequences.append(prompt_ids + answer_ids)
        label_rows.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    labels = torch.full((len(sequences), width), -100, dtype=torch.long)
    for i, (sequence, label_row) in enumerate(zip(sequences, label_rows)):
        input_ids[i, : len(sequence)] = torch.tensor(sequence)
        attention_mask[i, : len(sequence)] = 1
        labels[i, : len(label_row)] = torch.tensor(label_row)
    return input_ids, attention_mask, labels


def pretrain(
    model: torch.nn.Module,
    tokenizer,
    *,
    task: str,
    steps: int,
    batch_size: int,
    lr: float,
    max_operand: int,
    seed: int,
    min_digits: int = 8,
    max_digits: int = 16,
    period_fraction: float = 0.0,
) -> PretrainReport:
    """`steps` AdamW steps of next-token loss over freshly drawn training rows (a new
    batch each step from one seeded stream; cosine-decayed learning rate)."""
    started = time.perf_counter()
    rows = pretrain_rows(task, steps * batch_size, seed, max_operand, min_digits, max_digits, period_fraction)
    input_ids, attention_mask, labels = encode_examples(tokenizer, rows)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # same bytes on every machine and in every process
    losses: list[float] = []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, foreach=False)
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / steps))
            )
            model.train()
            for step in range(steps):
                batch = slice(step * batch_size, (step + 1) * batch_size)
                output = model(input_ids=input_ids[batch], attention_mask=attention_mask[batch], labels=labels[batch])
                optimizer.zero_grad(set_to_none=True)
                output.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                losses.append(float(output.loss.detach()))
            model.eval()
    finally:
        torch.set_num_threads(previous_threads)
    window = max(1, min(20, len(losses)))
    return PretrainReport(
        task=task,
        steps=steps,
        examples=len(rows),
        first_loss=sum(losses[:window]) / window if losses else float("nan"),
        last_loss=sum(losses[-window:]) / window if losses else float("nan"),
        seconds=time.perf_counter() - started,
    )

