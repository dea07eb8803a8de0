"""What travels between roles, by reference through Ray's object store (S-FLOW-2).

Notation: b = batch, p = padded prompt length, r = padded response length.
Each stage returns a *new* frozen Trajectory with its own fields added
(`dataclasses.replace`), so a stage can never mutate what an earlier one wrote.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class PromptBatch:
    """One iteration's prompts as projected from the data (untouched, S-DATA-2)."""

    iteration: int
    prompts: list[Any]
    references: list[str | None]
    metadata: list[dict[str, Any]]
    row_ids: list[int]
    sources: list[str] = field(default_factory=list)  # where each row came from, for error messages

    def shard(self, index: int, count: int) -> "PromptBatch":
        """Rows `index * b / count` up to the next shard's first: what rollout engine
        `index` of `count` generates. The config check refuses uneven batches; this
        refuses them again rather than drop the remainder rows silently."""
        if len(self.prompts) % count:
            raise ValueError(f"a batch of {len(self.prompts)} prompts cannot be cut into {count} equal shards")
        size = len(self.prompts) // count
        rows = slice(index * size, (index + 1) * size)
        return PromptBatch(
            self.iteration, self.prompts[rows], self.references[rows], self.metadata[rows], self.row_ids[rows],
            self.sources[rows],
        )

    @staticmethod
    def concat(parts: list["PromptBatch"]) -> "PromptBatch":
        return PromptBatch(
            parts[0].iteration,
            [p for part in parts for p in part.prompts],
            [r for part in parts for r in part.references],
            [m for part in parts for m in part.metadata],
            [i for part in parts for i in part.row_ids],
            [s for part in parts for s in part.sources],
        )


@dataclass(frozen=True)
class Trajectory:
    iteration: int
    policy_version: int               # version of the weights that sampled it (S-FLOW-6)
    prompts: PromptBatch
    prompt_ids: torch.Tensor          # (b, p) left-padded
    prompt_mask: torch.Tensor         # (b, p)
    response_ids: torch.Tensor        # (b, r) right-padded with pad ids
    response_mask: torch.Tensor       # (b, r) 1.0 up to and including EOS
    rollout_logprobs: torch.Tensor    # (b, r) sampling log-probs from the engine
    completions: list[str]
    batch_id: str | None = None       # set by replay: names the whole batch (S-FLOW-5)
    scores: torch.Tensor | None = None            # (b,) terminal reward (reward role)
    process_rewards: torch.Tensor | None = None   # (b, r) shaping term (reward role)
    correct: torch.Tensor | None = None           # (b,) 1.0 where the matcher accepted
    ref_logprobs: torch.Tensor | None = None      # (b, r) frozen reference (reference role)
    values: torch.Tensor | None = None            # (b, r) critic predictions (critic role)
    extras: dict[str, Any] = field(default_factory=dict)
    # Multi-turn episodes only (S-ENV-2); None keeps the single-turn path as it is.
    action_mask: torch.Tensor | None = None       # (b, r) 1.0 on sampled tokens; observations are 0
    turn_rewards: torch.Tensor | None = None      # (b, r) each turn's reward on its last sampled token
    episodes: list[dict[str, Any]] | None = None  # per row: messages, turns, tool_calls, cut, failed

    @property
    def prompt_length(self) -> int:
        return self.prompt_ids.shape[1]

    @property
    def loss_mask(self) -> torch.Tensor:
        """The tokens PPO trains on (policy loss, KL, values): the sampled ones."""
        return self.response_mask if self.action_mask is None else self.action_mask

    def sequences(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Full sequences (b, p + r) and their attention mask."""
        input_ids = torch.cat([self.prompt_ids, self.response_ids], dim=1)
        attention_mask = torch.cat([self.prompt_mask, self.response_mask.to(self.prompt_mask.dtype)], dim=1)
        return input_ids, attention_mask

    def require(self, *names: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(
                f"trajectory of iteration {self.iteration} lacks {', '.join(missing)}: a stage ran out of order"
            )


def batch_identity(trajectory: Trajectory) -> str:
    """A content hash of the whole batch, so receipts from every rank can be compared
    and a trainer can prove which batch it trained on (S-FLOW-5)."""
    digest = hashlib.sha256()
    digest.update(str(trajectory.iteration).encode())
    digest.update(trajectory.prompt_ids.numpy().tobytes())
    digest.update(trajectory.response_ids.numpy().tobytes())
    return f"iter{trajectory.iteration:06d}-{digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class PPOTargets:
    """Immutable PPO targets frozen by policy.prepare_batch (S-FLOW-3); the critic
    receives the same object."""

    batch_id: str
    iteration: int
    policy_version: int           # the policy's version when it froze these (the samples may be older)
    input_ids: torch.Tensor       # (b, p + r)
    attention_mask: torch.Tensor  # (b, p + r)
    prompt_length: int
    response_mask: torch.Tensor   # (b, r) float
    old_logprobs: torch.Tensor    # (b, r)
    old_values: torch.Tensor      # (b, r)
    advantages: torch.Tensor      # (b, r)
    returns: torch.Tensor         # (b, r)
    extras: dict[str, Any] = field(default_factory=dict)  # the trajectory's extras (multimodal inputs, S-RUN-6)
    behaviour_weights: torch.Tensor | None = None  # (b, r) pi_prox/pi_behav, one step off only (S-ASYNC-2)

    @property
    def num_samples(self) -> int:
        return self.input_ids.shape[0]


@dataclass(frozen=True)
class TrainReceipt:
    """What a trainable role publishes after training on a batch (S-FLOW-5)."""

    role: str
    batch_id: str
    rank: int
    optimizer_step: int
    metrics: dict[str, float]
