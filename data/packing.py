"""The DataPacker seam: projected prompts in, model inputs out (S-RUN-6).

Only the packer knows how a model family turns prompts into tensors; roles and the
flow never look inside a prompt. What a vision-language model needs beyond token ids
travels as `MultimodalInputs` in `Trajectory.extras`, by reference, to every later
forward pass (docs/howto/custom-datapacker.md).

Notation: b = batch, p = padded prompt length, s = full sequence length (p + r).
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import torch

from contracts.faults import RepeatsOnRerun
from data.chat_render import as_conversation, render_all, render_prompt
from data.prompt_projection import conversation_without_template

MULTIMODAL_EXTRA = "multimodal"
"""Key of `MultimodalInputs` in `Trajectory.extras` and `PPOTargets.extras`."""


@dataclass(frozen=True)
class MultimodalInputs:
    """Model inputs beyond token ids, kept per sample so any subset of rows (a
    minibatch, a micro-batch) gets exactly its own pixels.

    Why per sample: a batch concatenates every image's patches into one tensor, so a
    row's pixels would be found only by summing the rows before it; per sample,
    selection is a plain index and concatenation happens at the forward, in row order.

    token_types: (b, p) int64, one value per prompt token (Qwen-VL's
        `mm_token_type_ids`: 0 text, 1 image, 2 video), aligned with the
        left-padded prompt ids; the response is text and is extended with 0.
    per_sample: for each of the b samples, the tensors concatenated along dim 0
        across selected samples, e.g. `pixel_values` (patches_i, d),
        `image_grid_thw` (images_i, 3), `pixel_values_videos` (patches_i, d),
        `video_grid_thw` (videos_i, 3), `second_per_grid_ts` (videos_i,).
        A text-only sample has an empty dict.
    never_generate: token ids outside the policy's action space (a VLM's vision
        placeholders), masked in sampling and in every log-prob, so all roles
        share one distribution.
    token_types_key: the forward keyword the token types go under.
    """

    token_types: torch.Tensor
    per_sample: tuple[dict[str, torch.Tensor], ...]
    never_generate: tuple[int, ...] = ()
    token_types_key: str = "mm_token_type_ids"

    def __post_init__(self) -> None:
        if self.token_types.shape[0] != len(self.per_sample):
            raise ValueError(
                f"MultimodalInputs: token_types has {self.token_types.shape[0]} rows but per_sample has "
                f"{len(self.per_sample)} samples"
            )

    @property
    def has_media(self) -> bool:
        return any(self.per_sample)

    def forward_kwargs(
        self, sequence_length: int, index: Sequence[int] | torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Keyword arguments for the model's forward (or `generate`) over rows `index`
        (all rows when None) of sequences of `sequence_length` (p for generation,
        p + r for scoring and training).

        Empty when no selected row has an image or video: such a batch is plain text,
        and the caller makes exactly the text-model call.
        """
        rows = list(range(len(self.per_sample))) if index is None else torch.as_tensor(index).reshape(-1).tolist()
        keys = sorted({key for row in rows for key in self.per_sample[row]})
        if not keys:
            return {}
        kwargs = {
            key: torch.cat([self.per_sample[row][key] for row in rows if key in self.per_sample[row]], dim=0)
            for key in keys
        }
        token_types = self.token_types[rows]
        extra = sequence_length - token_types.shape[1]
        if extra < 0:
            raise ValueError(f"sequence_length {sequence_length} is shorter than the prompt ({token_types.shape[1]})")
        kwargs[self.token_types_key] = torch.nn.functional.pad(token_types, (0, extra), value=0)
        return kwargs


def concat_multimodal(parts: Sequence[MultimodalInputs], prompt_length: int) -> MultimodalInputs:
    """The multimodal inputs of several rollout shards as one batch, in shard order;
    token types are left-padded (with 0, text) to the merged prompt length, as the
    prompt ids are."""
    token_types = torch.cat(
        [
            torch.nn.functional.pad(part.token_types, (prompt_length - part.token_types.shape[1], 0), value=0)
            for part in parts
        ]
    )
    return dataclasses.replace(
        parts[0], token_types=token_types, per_sample=tuple(row for part in parts for row in part.per_sample)
    )


@dataclass(frozen=True)
class PackedPrompts:
    """Model inputs for generation.

    input_ids, attention_mask: (b, p), left-padded so every response starts at column p.
    multimodal: pixels and whatever else a vision-language forward needs; None for text packers.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    multimodal: MultimodalInputs | None = None


@runtime_checkable
class DataPacker(Protocol):
    def pack_prompts(self, prompts: Sequence[Any], sources: Sequence[str] | None = None) -> PackedPrompts:
        """Prompts exactly as projected (a string or a conversation each); `sources[i]`
        names prompt i's row for error messages ("rows.jsonl row 3 (line 4, column 1)")."""
        ...

    def decode_completions(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        """The inverse for trajectories: response tokens (b, r) and mask (b, r) to the
        completion texts the reward sees."""
        ...


def prompt_location(sources: Sequence[str] | None, index: int) -> str:
    return sources[index] if sources else f"prompt {index} of the batch"


class UnsupportedPromptError(ValueError, RepeatsOnRerun):
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


def load_chat_tokenizer(path: str):
    """The model's tokenizer, left-padding (responses start at one column) and with a
    pad token (the EOS when the model has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    return [
        tokenizer.decode(ids[mask.bool()], skip_special_tokens=True) for ids, mask in zip(response_ids, response_mask)
    ]


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
                raise UnsupportedPromptError(
                    f"{prompt_location(sources, index)}: {part} cannot be packed by the text-only ChatTextPacker; "
                    "configure a multimodal DataPacker for image and video prompts"
                )
        texts = render_all(  # S-BYO-4: a template's refusal names the row and repeats on rerun
            lambda conversation: render_prompt(self.tokenizer, conversation), conversations, sources,
            template="the model's chat template",
        )
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return PackedPrompts(encoded["input_ids"], encoded["attention_mask"])

    def decode_completions(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return decode_responses(self.tokenizer, response_ids, response_mask)


class PlainTextPacker:
    """Causal-LM packer for a base model whose tokenizer has no chat template: each
    prompt string is tokenized as it is, with the tokenizer's own special tokens (a
    BOS where it adds one). A conversation is refused: joining its turns would invent
    a format the model never saw."""

    def __init__(self, tokenizer, model_path: str = "model.path"):
        self.tokenizer = tokenizer
        self.model_path = model_path

    def pack_prompts(self, prompts: Sequence[Any], sources: Sequence[str] | None = None) -> PackedPrompts:
        for index, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                raise UnsupportedPromptError(
                    conversation_without_template(prompt_location(sources, index), "prompt", self.model_path)
                )
        encoded = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        return PackedPrompts(encoded["input_ids"], encoded["attention_mask"])

    def decode_completions(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return decode_responses(self.tokenizer, response_ids, response_mask)


def chat_text_packer(model_path: str) -> ChatTextPacker:
    """The chat-template packer, whatever the tokenizer (`data_packer.factory`)."""
    return ChatTextPacker(load_chat_tokenizer(model_path))


def plain_text_packer(model_path: str) -> PlainTextPacker:
    """The prompt text as it is, even where the tokenizer has a template (`data_packer.factory`)."""
    return PlainTextPacker(load_chat_tokenizer(model_path), model_path)


def text_packer(model_path: str) -> ChatTextPacker | PlainTextPacker:
    """The default for causal LMs: the chat template where the tokenizer has one, the
    prompt text as it is where it has none (S-BYO-1)."""
    tokenizer = load_chat_tokenizer(model_path)
    return ChatTextPacker(tokenizer) if tokenizer.chat_template else PlainTextPacker(tokenizer, model_path)

