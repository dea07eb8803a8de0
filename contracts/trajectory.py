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
    # The prompt each row samples, as its position among the iteration's prompts: rows of
    # one prompt share it and sit side by side (S-OPT-2). Empty: every row its own prompt.
    group_ids: list[int] = field(default_factory=list)

    def group_index(self) -> list[int]:
        """Each row's group: what group estimators (GRPO, RLOO) compare a sample within."""
        return list(self.group_ids) if self.group_ids else list(range(len(self.prompts)))

    def shard(self, index: int, count: int) -> "PromptBatch":
        """Rows `index * b / count` up to the next shard's first: what rollout engine
        `index` of `count` generates. The config check refuses uneven batches; this
        refuses them again rather than drop the remainder rows silently."""
        if len(self.prompts) % count:
            raise ValueError(f"a batch of {len(self.prompts)} prompts cannot be cut into {count} equal shards")
        size = len(self.prompts) // count
        rows = slice(index * size, (index + 1) * size)
        # S-OPT-2: a prompt's samples are one group; a cut through one would split it over engines.
        groups, edges = self.group_ids, (rows.start, rows.stop)
        if groups and any(groups[edge - 1] == groups[edge] for edge in edges if 0 < edge < len(groups)):
            raise ValueError(
                f"shard {index} of {count} of a batch of {len(groups)} samples ({len(set(groups))} prompts) would "
                "split one prompt's samples over two engines"
            )
        return PromptBatch(
            self.iteration, self.prompts[rows], self.references[rows], self.metadata[rows], self.row_ids[rows],
            self.sources[rows], self.group_ids[rows],
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
            [g for part in parts for g in part.group_index()] if any(part.group_ids for part in parts) else [],
        )


@dataclass(frozen=True)
class Transcript:
    """What an episode said and did, for the experience rows and the samples table:
    plain values, so it travels through the object store and into JSON as it is."""

    messages: list[dict[str, str]]  # role/content pairs, the opening included
    turns: int
    tool_calls: int
    cut: bool      # ended by a token or turn limit rather than by the environment
    failed: bool   # ended by an environment error (rl.env.on_error=end)

    def row_fields(self) -> dict[str, Any]:
        return {"messages": self.messages, "turns": self.turns, "tool_calls": self.tool_calls, "cut": self.cut}


@dataclass(frozen=True)
class Trajectory:
    """Every rollout is an episode (S-PATH-1): the response holds the sampled turns and,
    between them, the environment's observations; `action_mask` tells them apart. A
    single-turn rollout is a one-turn episode whose action mask is its response mask
    (`Trajectory.one_turn`). Every reward term writes into `token_scores` at the token
    that earned it, so the trainers see one shape whatever produced the batch."""

    iteration: int
    policy_version: int               # version of the weights that sampled it (S-FLOW-6)
    prompts: PromptBatch
    prompt_ids: torch.Tensor          # (b, p) left-padded
    prompt_mask: torch.Tensor         # (b, p)
    response_ids: torch.Tensor        # (b, r) right-padded with pad ids
    response_mask: torch.Tensor       # (b, r) 1.0 on every real token: sampled turns and observations
    rollout_logprobs: torch.Tensor    # (b, r) sampling log-probs from the engine (0 off the actions)
    completions: list[str]            # each row's last assistant turn, decoded
    action_mask: torch.Tensor         # (b, r) 1.0 on sampled tokens: what PPO trains on (policy, KL, values)
    token_scores: torch.Tensor        # (b, r) every reward term where it was earned; the rollout writes the
                                      # environment's, the reward role adds the rule's, the model's and shaping
    batch_id: str | None = None       # set by replay: names the whole batch (S-FLOW-5)
    sequence_scores: torch.Tensor | None = None   # (b,) the outcome per row, summed over turns, shaping left
                                                  # out: what the reward metrics and rows show (reward role)
    correct: torch.Tensor | None = None           # (b,) 1.0 where the matcher (or the environment) accepted
    ref_logprobs: torch.Tensor | None = None      # (b, r) frozen reference (reference role)
    values: torch.Tensor | None = None            # (b, r) critic predictions (critic role)
    extras: dict[str, Any] = field(default_factory=dict)
    transcripts: tuple[Transcript, ...] = ()      # per row, for rollouts with an environment (S-ENV)

    @staticmethod
    def one_turn(**fields: Any) -> "Trajectory":
        """A single-turn rollout: every response token was sampled, and no environment
        rewarded any of them (the reward role scores the completion)."""
        response_mask = fields["response_mask"]
        return Trajectory(action_mask=response_mask, token_scores=torch.zeros_like(response_mask), **fields)

    @property
    def prompt_length(self) -> int:
        return self.prompt_ids.shape[1]

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
    response_mask: torch.Tensor   # (b, r) float: the trajectory's action mask, the tokens trained on
    old_logprobs: torch.Tensor    # (b, r)
    old_values: torch.Tensor      # (b, r)
    advantages: torch.Tensor      # (b, r)
    returns: torch.Tensor         # (b, r)
    extras: dict[str, Any] = field(default_factory=dict)  # the trajectory's extras (multimodal inputs, S-RUN-6)
    # (b, r) min(pi_old/pi_engine, cap), frozen: one step off (S-ASYNC-2) or with
    # rl.rollout.engine_mismatch_cap (S-OPT-1); None otherwise
    behaviour_weights: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None  # (b, r) log pi_ref, with the KL in the loss only (S-OPT-1)
    kl_coef: float | None = None  # the loss's KL coefficient these targets were frozen with (rl.kl_in=loss)

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
