"""The interface both rollout engines implement, so every other role is identical
on a laptop (transformers) and on a GPU node (vLLM).

Notation: b = batch, p = padded prompt length, r = padded response length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, Sequence

import torch

from data.packing import PackedPrompts


@dataclass(frozen=True)
class GenerationResult:
    response_ids: torch.Tensor   # (b, r) right-padded with the pad id
    response_mask: torch.Tensor  # (b, r) float, 1.0 up to and including EOS
    logprobs: torch.Tensor       # (b, r) log-probs of the sampled tokens under the sampling distribution


class RolloutEngine(Protocol):
    # True when load_weights still holds a bucket's tensors after taking the next one
    # (vLLM stages every bucket for one reload); a NIXL fetch then gives each bucket
    # tensors of its own instead of views of its one receive buffer.
    keeps_buckets: bool
    # Whether PackedPrompts.multimodal reaches `generate` (S-RUN-6); the rollout role
    # refuses a vision-language batch naming the key otherwise.
    accepts_multimodal: bool
    # Where the engine computes, as the role's `ready` reports it; None where the engine
    # places its own workers (vLLM, inside the actor's GPU bundle).
    device: torch.device | None

    def generate(
        self, prompts: PackedPrompts, *, max_new_tokens: int, temperature: float, seed: int, greedy: bool = False,
        stop_token_ids: tuple[int, ...] = (),
    ) -> GenerationResult:
        """`greedy` (held-out evaluation, S-OPS-2) takes the most likely token and ignores
        `temperature` and `seed`; its log-probs are then at temperature 1.
        `stop_token_ids`: tokens besides EOS that end a response as EOS does (kept in it,
        mask 1.0 through the first): an episode's turn ends (Llama's `<|eom_id|>`)."""
        ...

    def weight_names(self) -> list[str] | None:
        """The Hugging Face names of every weight the engine's model holds, which a
        publication must cover exactly once; None where the engine cannot list them
        (vLLM keeps its model in its own workers, under its own fused names)."""
        ...

    def load_weights(self, buckets: Iterable[Mapping[str, torch.Tensor]]) -> int:
        """Install new policy weights bucket by bucket, each copied in before the next
        is taken (S-SCALE-3); returns the bytes received."""
        ...

    def sleep(self) -> None:
        """Release accelerator memory while a colocated trainer updates (S-RUN-4)."""
        ...

    def wake_up(self) -> None: ...


def response_mask_from_ids(response_ids: torch.Tensor, eos_token_id: int | Sequence[int]) -> torch.Tensor:
    """1.0 up to and including the first EOS (any of several) of each row; everything
    after is padding."""
    ends = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    is_eos = torch.isin(response_ids, torch.tensor(ends, dtype=response_ids.dtype, device=response_ids.device))
    eos_seen_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return (~eos_seen_before).float()
