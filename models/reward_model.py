"""A learned reward model loaded here: a one-label sequence classifier scoring each
prompt and completion as one text in its own format (S-RM-1).

The policy and the reward model need not share a tokenizer: the prompt and the
decoded completion are rendered with the reward model's own chat template (the
conversation plus an assistant turn) where it has one, as prompt text followed by the
completion where it has none, and tokenized with its own tokenizer. The score is the
classifier's logit at the last token (transformers' sequence-classification pooling,
the same a TRL or OpenRLHF reward-model trainer trained it with).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from configs.schema import RewardModelConfig
from contracts.faults import RepeatsOnRerun
from data.chat_render import render_scored, template_failure
from models.cut_forward import cut_lengths_by_tokens

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class RewardModelError(ValueError, RepeatsOnRerun):
    """The reward model folder, or one completion's text, cannot be scored as configured."""


@dataclass(frozen=True)
class RowOrigin:
    row_id: int
    source: str | None

    @property
    def where(self) -> str:
        return f"row {self.row_id}" + (f" ({self.source})" if self.source else "")


def ensure_reward_model(model: RewardModelConfig) -> str | None:
    """The reward model folder to load; builds the tiny one on first use. None when
    only a URL is configured."""
    if model.path is None:
        return None
    if model.tiny is not None:
        from models.tiny_reward_model import build_tiny_reward_model

        build_tiny_reward_model(model.path, model.tiny)
    return model.path


def load_reward_classifier(path: str, dtype: str) -> torch.nn.Module:
    """AutoModelForSequenceClassification with exactly one label, frozen, in eval mode."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from models.model_io import quiet_transformers

    quiet_transformers()
    config = AutoConfig.from_pretrained(path)
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        raise RewardModelError(
            f"rl.reward.model.path: {path} holds a {', '.join(architectures) or config.model_type}, not a sequence "
            "classifier; a reward model is saved by AutoModelForSequenceClassification (num_labels=1), as TRL's and "
            "OpenRLHF's reward trainers write it"
        )
    if config.num_labels != 1:
        raise RewardModelError(
            f"rl.reward.model.path: {path} is a sequence classifier with {config.num_labels} labels; a reward model "
            "has one (its logit is the score)"
        )
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=_DTYPES[dtype]).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


class RewardText:
    """How the reward model reads a prompt and its completion, from its own folder: the
    text its tokenizer renders (its chat template, or prompt text then completion), and
    the length check that refuses a text longer than `max_length` tokens, naming its row,
    instead of truncating it. The same for a local and a served reward model."""

    def __init__(self, path: str, max_length: int):
        from transformers import AutoTokenizer

        self.path = path
        self.max_length = max_length
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "right"  # positions count from the first token, as in training
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def add_special_tokens(self) -> bool:
        """False for texts a chat template rendered: they hold their own BOS."""
        return not self.has_chat_template

    def render(self, prompt: Any, completion: str, where: str = "a prompt") -> str:
        if self.has_chat_template:
            try:
                return render_scored(self.tokenizer, prompt, completion)
            except Exception as error:  # S-BYO-4: named with its row, and a rerun repeats it
                raise template_failure(
                    lambda turns: render_scored(self.tokenizer, turns, completion), prompt, error, where=where,
                    prompt_key="prompt", template=f"the reward model's chat template ({self.path})",
                ) from error
        if not isinstance(prompt, str):
            raise RewardModelError(
                f"rl.reward.model.path: {self.path}'s tokenizer has no chat template, so a conversation prompt cannot "
                "be rendered for it; use a reward model with a chat template or string prompts"
            )
        return prompt + completion

    def token_ids(self, texts: Sequence[str], rows: Sequence[RowOrigin]) -> list[list[int]]:
        """Each text's ids (the tokenizer's own special tokens added as it adds them);
        the first one over `max_length` fails naming its row."""
        encoded = self.tokenizer(list(texts), add_special_tokens=self.add_special_tokens)["input_ids"]
        for ids, row in zip(encoded, rows):
            if len(ids) > self.max_length:
                raise RewardModelError(
                    f"{row.where}: the prompt and completion are {len(ids)} tokens in the reward model's tokenizer "
                    f"({self.path}), over rl.reward.model.max_length={self.max_length}; scoring a truncated text "
                    "would score what the completion did not say. Raise rl.reward.model.max_length (up to the model's "
                    "context) or shorten the prompts"
                )
        return encoded


class PlainText:
    """A served reward model with no folder here: the prompt text then the completion,
    sent as they are; the server counts the tokens."""

    path = None
    has_chat_template = False
    add_special_tokens = True

    def render(self, prompt: Any, completion: str, where: str = "a prompt") -> str:
        if not isinstance(prompt, str):
            raise RewardModelError(
                "rl.reward.model.url: a conversation prompt needs the reward model's chat template; set "
                "rl.reward.model.path to the served model's folder (its tokenizer renders the prompt)"
            )
        return prompt + completion

    def token_ids(self, texts: Sequence[str], rows: Sequence[RowOrigin]) -> None:
        return None


class RewardScorer(Protocol):
    """Raw scores (b,) float32 on the host for rendered texts (and their ids, where the
    text was tokenized here): a local model or a server, chosen once per run."""

    def score(
        self, texts: Sequence[str], encoded: Sequence[list[int]] | None, rows: Sequence[RowOrigin]
    ) -> torch.Tensor:
        ...


class LocalScorer:
    """The reward model loaded in this process, scoring the token ids its text made."""

    def __init__(
        self, text: RewardText, dtype: str, batch_size: int, micro_batch_tokens: int | None = None,
        device: str = "cpu",
    ):
        self.text = text
        self.batch_size = batch_size
        self.micro_batch_tokens = micro_batch_tokens  # S-PATH-3: length-grouped forwards instead
        self.model = load_reward_classifier(text.path, dtype)
        if self.model.config.pad_token_id is None:
            # Sequence-classification pooling finds each row's last token by the pad id.
            self.model.config.pad_token_id = text.tokenizer.pad_token_id
        if device != "cpu":
            self.model.to(device)  # frozen and never parked: it stays there for the run

    def score(
        self, texts: Sequence[str], encoded: Sequence[list[int]] | None, rows: Sequence[RowOrigin]
    ) -> torch.Tensor:
        assert encoded is not None
        return self.score_ids(encoded)

    @torch.no_grad()
    def score_ids(self, encoded: Sequence[list[int]]) -> torch.Tensor:
        """Raw scores (b,) float32 on the host: `batch_size` texts per forward, or texts of
        similar length up to `micro_batch_tokens` per forward; each forward is as wide
        as its longest text."""
        device = next(self.model.parameters()).device
        scores = torch.zeros(len(encoded))
        pad = self.text.tokenizer.pad_token_id
        for positions in cut_lengths_by_tokens([len(ids) for ids in encoded], self.micro_batch_tokens, self.batch_size):
            chunk = [encoded[position] for position in positions]
            width = max(len(ids) for ids in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, ids in enumerate(chunk):
                input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, :len(ids)] = 1
            logits = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
            scores[positions] = logits[:, 0].float().cpu()
        return scores
