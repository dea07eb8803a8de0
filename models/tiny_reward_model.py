"""A tiny reward model, built and trained locally like the tiny policy (no download):
a one-label Qwen3 sequence classifier with the tiny policy's character tokenizer and
chat template, trained briefly on preference pairs whose truth is a rule the policy
never sees (S-RM-1, `configs/ppo_tiny_rlhf_cpu.py`).

The pairs are rendered exactly as the reward role renders what it scores (the
conversation plus an assistant turn, through the chat template), and trained with the
Bradley-Terry loss -log sigmoid(r_chosen - r_rejected) (Ouyang et al. 2022, eq. 1;
TRL's RewardTrainer). Deterministic: fixed seed, one thread, fixed order.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForSequenceClassification

from configs.schema import TinyRewardModelSpec
from models.tiny_model import build_once, build_tokenizer, text_model_kwargs

TINY_REWARD_SPEC_FILE = "tiny_reward_spec.json"
TRAINING_REPORT_FILE = "tiny_reward_training.json"


@dataclass(frozen=True)
class RewardTrainingReport:
    task: str
    steps: int
    first_loss: float
    last_loss: float
    pair_accuracy: float  # share of every (prompt, chosen, rejected) pair ranked right after training
    seconds: float


def preference_pairs(task: str, alphabet: str) -> list[tuple[str, str, str]]:
    """Every (prompt, chosen, rejected) of the task: for `copy_digit`, the prompt's digit
    is preferred over every other digit and over the empty answer."""
    if task != "copy_digit":
        raise ValueError(f"rl.reward.model.tiny.task={task!r} has no preference pairs (accepted: copy_digit)")
    digits = [c for c in "0123456789" if c in alphabet]
    return [(d, d, other) for d in digits for other in [*digits, ""] if other != d]


def render(tokenizer, prompt: str, completion: str) -> list[int]:
    conversation = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    text = tokenizer.apply_chat_template(conversation, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _batch(tokenizer, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        mask[row, :len(ids)] = 1
    return input_ids, mask


def train_on_pairs(model, tokenizer, spec: TinyRewardModelSpec) -> RewardTrainingReport:
    pairs = preference_pairs(spec.task, spec.task_alphabet)
    encoded = [(render(tokenizer, p, c), render(tokenizer, p, r)) for p, c, r in pairs]
    order = random.Random(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train_lr)
    started, losses = time.perf_counter(), []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            model.train()
            for _ in range(spec.train_steps):
                chosen_ids, rejected_ids = zip(*[order.choice(encoded) for _ in range(spec.train_batch_size)])
                input_ids, mask = _batch(tokenizer, [*chosen_ids, *rejected_ids])
                scores = model(input_ids=input_ids, attention_mask=mask).logits[:, 0]
                chosen, rejected = scores.split(spec.train_batch_size)
                loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
        model.eval()
        with torch.no_grad():
            chosen_ids, rejected_ids = zip(*encoded)
            input_ids, mask = _batch(tokenizer, [*chosen_ids, *rejected_ids])
            chosen, rejected = model(input_ids=input_ids, attention_mask=mask).logits[:, 0].split(len(encoded))
            accuracy = float((chosen > rejected).float().mean())
    finally:
        torch.set_num_threads(threads)
    return RewardTrainingReport(
        task=spec.task, steps=spec.train_steps, first_loss=losses[0] if losses else float("nan"),
        last_loss=losses[-1] if losses else float("nan"), pair_accuracy=accuracy,
        seconds=round(time.perf_counter() - started, 2),
    )


def _write(staging: Path, spec: TinyRewardModelSpec) -> None:
    tokenizer = build_tokenizer(spec.task_alphabet)
    config = Qwen3Config(
        **text_model_kwargs(spec, tokenizer), head_dim=spec.hidden_size // spec.num_attention_heads, num_labels=1
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3ForSequenceClassification(config)
    report = train_on_pairs(model, tokenizer, spec)
    (staging / TRAINING_REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    (staging / TINY_REWARD_SPEC_FILE).write_text(
        json.dumps(spec.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"
    )
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)


def build_tiny_reward_model(path: str | Path, spec: TinyRewardModelSpec) -> Path:
    """Write the trained tiny reward model to `path` once (atomically, under a lock;
    see `models.tiny_model.build_once`)."""
    return build_once(path, lambda staging: _write(staging, spec))
