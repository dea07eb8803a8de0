"""Brief supervised pre-training of the tiny model on synthetic arithmetic, reversal, or
a tool-use episode.

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
from data.synthetic import LOOK_UP_REQUEST, addition_split, key_lookup_split, reverse_digits_split
from environments.chat_tokens import render
from environments.key_lookup import KeyLookup
from environments.protocol import EnvRow

Segments = list[tuple[str, bool]]
"""One training example as text pieces in order; True marks an assistant turn, which
is trained on and followed by the EOS that ends it."""


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
    if task == "tool_lookup":
        return list(key_lookup_split(num_rows, seed=seed, split="train"))
    raise ValueError(
        f"model.tiny.pretrain_task={task!r} has no pre-training data (accepted: addition, reverse, tool_lookup)"
    )


def with_trailing_period(rows: list[dict], fraction: float, seed: int) -> list[dict]:
    """A seeded share of the answers end with a period: the habit a base model brings
    (sentences end with one) and an exact-match reward counts as wrong."""
    habit = random.Random(f"period-{seed}")
    return [
        {**row, "reference": row["reference"] + "."} if habit.random() < fraction else row for row in rows
    ]


def answer_segments(tokenizer, row: dict) -> Segments:
    """A prompt and its reference answer. The prompt uses the chat template with the
    generation prompt, exactly as `data.packing.ChatTextPacker` packs it for the rollout."""
    prompt = tokenizer.apply_chat_template(as_conversation(row["prompt"]), add_generation_prompt=True, tokenize=False)
    return [(prompt, False), (row["reference"], True)]


def episode_segments(tokenizer, reset, turns: list[tuple[dict, list[dict]]]) -> Segments:
    """An episode's text as the episode loop builds it: the opening prompt, then per
    turn the assistant's text and the observation, which is what the template adds
    after the turn's EOS when the new messages and a generation prompt are appended.
    `turns`: (assistant message, the messages its step returned)."""

    history = list(reset.messages)
    opened = render(tokenizer, history, reset.tools, generation=True)
    segments: Segments = [(opened, False)]
    for assistant, observation in turns:
        closed = render(tokenizer, history + [assistant], reset.tools, generation=False)
        turn_end = closed.rindex(tokenizer.eos_token) + len(tokenizer.eos_token)
        history += [assistant, *observation]
        following = render(tokenizer, history, reset.tools, generation=True) if observation else closed
        # The episode loop's tokens are the concatenation: each rendering must extend the last.
        if not (closed.startswith(opened) and following.startswith(closed[:turn_end])):
            raise ValueError("the chat template renders an episode's history differently as it grows")
        segments.append((closed[len(opened) : turn_end - len(tokenizer.eos_token)], True))
        if observation:
            segments.append((following[turn_end:], False))
        opened = following  # the next turn opens where this one's observation left off
    return segments


UNLOOKED_ANSWER = "unknown"


def lookup_transcripts(tokenizer, rows: list[dict], habit_fraction: float, seed: int) -> list[Segments]:
    """Whole key-lookup episodes, played against the environment itself: call `get`
    with the row's key, then answer with the value it returns. Asked the bare question
    ("value of GN"), a seeded share `habit_fraction` of the episodes instead answers
    "unknown" at once: the habit of answering without looking, which PPO has to
    unlearn; asked to look the key up, every episode does. So greedy decoding looks up
    only when asked to, while sampling finds the reward for the bare question too.
    The habit answers one word, not a guessed number, so that the greedy first token
    weighs the habit against the call (a guess spreads its share over nine first
    digits)."""
    habit = random.Random(f"unlooked-{seed}")
    transcripts = []
    for index, row in enumerate(rows):
        environment = KeyLookup()
        reset = environment.reset(EnvRow(row["prompt"], row["reference"], {"key": row["key"]}, index), seed)
        bare_question = row["prompt"] != LOOK_UP_REQUEST.format(key=row["key"])
        if habit.random() < habit_fraction and bare_question:
            turns = [({"role": "assistant", "content": UNLOOKED_ANSWER}, [])]
        else:
            call = {"type": "function", "function": {"name": "get", "arguments": {"key": row["key"]}}}
            lookup = {"role": "assistant", "content": "", "tool_calls": [call]}
            answer = {"role": "assistant", "content": row["reference"]}
            turns = [(lookup, environment.step(lookup).messages), (answer, [])]
            if environment.step(answer).reward != 1.0:
                raise AssertionError(f"the key lookup environment refused its own answer for row {index}")
        transcripts.append(episode_segments(tokenizer, reset, turns))
    return transcripts


def pretrain_examples(tokenizer, task: str, rows: list[dict], habit_fraction: float, seed: int) -> list[Segments]:
    if task == "tool_lookup":
        return lookup_transcripts(tokenizer, rows, habit_fraction, seed)
    return [answer_segments(tokenizer, row) for row in rows]


# Qwen3 normalises each head's queries and keys (q_norm, k_norm: gains born at 1), which
# bounds how sharply a head attends until the gains grow. The tool task copies a key and
# a value across its episode, which needs sharp heads: with gains that learn ten times
# faster the copies form within the pre-training (docs/performance.md, "Tool use").
ATTENTION_GAIN_LR_FACTOR = {"tool_lookup": 10.0}


def parameter_groups(model: torch.nn.Module, task: str, lr: float):
    factor = ATTENTION_GAIN_LR_FACTOR.get(task)
    if factor is None:
        return model.parameters()
    named = list(model.named_parameters())
    is_gain = [name.endswith(("q_norm.weight", "k_norm.weight")) for name, _ in named]
    return [
        {"params": [p for (_, p), gain in zip(named, is_gain) if not gain]},
        {"params": [p for (_, p), gain in zip(named, is_gain) if gain], "lr": lr * factor},
    ]


def encode_examples(tokenizer, examples: list[Segments]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (n, t) input ids, attention mask and labels; labels are -100 except
    on the assistant's turns and their EOS, so the model learns to answer, not to
    write prompts or tool results."""
    sequences, label_rows = [], []
    for segments in examples:
        sequence, label_row = [], []
        for text, assistant in segments:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if assistant:
                ids = ids + [tokenizer.eos_token_id]
            sequence += ids
            label_row += ids if assistant else [-100] * len(ids)
        sequences.append(sequence)
        label_rows.append(label_row)
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
    input_ids, attention_mask, labels = encode_examples(
        tokenizer, pretrain_examples(tokenizer, task, rows, period_fraction, seed)
    )
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # same bytes on every machine and in every process
    losses: list[float] = []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            optimizer = torch.optim.AdamW(
                parameter_groups(model, task, lr), lr=lr, weight_decay=0.0, foreach=False
            )
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

