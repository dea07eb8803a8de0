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


class UnsupportedPromptError(ValueError):
    pass


def _non_text_part(conversation: list[dict]) -> str | None:
    """Key path of the first image/video part, or None for a text-only conversation."""
    for m, message in enumerate(conversation):
        content = message.get("content")
        if isinstance(content, list):
            for p, part in enumerate(content):
                if part.get("type") != "text":
                    return f"prompt[{m}].content[{p}] (type {part.get('type')!r})"
    return None


class ChatTextPacker:
    """Causal-LM packer: the tokenizer's chat template with the generation prompt.

    Content may be a string or a list of text parts (the template joins them); an
    image or video part is refused by name, since a text-only model would otherwise
    be shown a prompt with its pictures silently removed.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def pack_prompts(self, prompts: Sequence[Any], sources: Sequence[str] | None = None) -> PackedPrompts:
        conversations = [as_conversation(p) for p in prompts]
        for index, conversation in enumerate(conversations):
            part = _non_text_part(conversation)
            if part is not None:
                where = sources[index] if sources else f"prompt {index} of the batch"
                raise UnsupportedPromptError(
                    f"{where}: {part} cannot be packed by the text-only ChatTextPacker; "
                    "configure a multimodal DataPacker for image and video prompts (S-RUN-6)"
                )
        texts = [
            self.tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations
        ]
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return PackedPrompts(encoded["input_ids"], encoded["attention_mask"])

    def decode_completions(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return [
            self.tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
            for ids, mask in zip(response_ids, response_mask)
        ]
