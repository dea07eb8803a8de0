"""The DataPacker seam: projected prompts in, model inputs out.

Only the packer knows how a model family turns prompts into tensors (chat template,
later pixels); roles and the flow never look inside a prompt (S-RUN-6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch


@dataclass(frozen=True)
class PackedPrompts:
    """Model inputs for generation.

    input_ids, attention_mask: (b, p), left-padded so every response starts at column p.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor


class DataPacker(Protocol):
    def pack_prompts(self, prompts: Sequence[Any]) -> PackedPrompts: ...

    def decode_completions(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]: ...


def as_conversation(prompt: Any) -> list[dict]:
    """A bare string prompt is one user turn (S-DATA-2)."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


class ChatTextPacker:
    """Causal-LM packer: the tokenizer's chat template with the generation prompt."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def pack_prompts(self, prompts: Sequence[Any]) -> PackedPrompts:
        texts = [
            self.tokenizer.apply_chat_template(as_conversation(p), add_generation_prompt=True, tokenize=False)
            for p in prompts
        ]
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return PackedPrompts(encoded["input_ids"], encoded["attention_mask"])

    def decode_completions(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return [
            self.tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
            for ids, mask in zip(response_ids, response_mask)
        ]
