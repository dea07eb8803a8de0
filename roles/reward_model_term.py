"""The reward role's learned-model term (S-RM-1): each completion scored by the reward
model (loaded in this actor, or served at `rl.reward.model.url`), checked finite,
shaped (normalisation, clipping, missing-EOS penalty, weight), with the running
moments that a boundary keeps."""

from __future__ import annotations

import json
from typing import Any

import fsspec
import torch

from checkpoint.role_files import saving, write_file
from algorithm.reward_model_scores import RunningMoments, first_non_finite, shape_model_scores
from configs.schema import PPOConfig
from contracts.trajectory import Trajectory
from models.reward_model import (
    LocalScorer, PlainText, RewardModelError, RewardScorer, RewardText, RowOrigin, ensure_reward_model,
)

MOMENTS_FILE = "reward_moments.json"


class RewardModelTerm:
    """The text the reward model reads (rendered and length-checked by its own
    tokenizer, or plain text for a served model with no folder here) and the scorer
    that scores it (the model loaded here, or the server), each chosen once."""

    def __init__(self, config: PPOConfig, device: str = "cpu"):
        settings = config.rl.reward.model
        assert settings is not None
        self.settings = settings
        self.device = device
        folder = ensure_reward_model(settings)
        self.text: RewardText | PlainText = RewardText(folder, settings.max_length) if folder else PlainText()
        self.scorer: RewardScorer
        if settings.url is not None:
            from models.reward_client import RewardClient, ServedScorer

            self.scorer = ServedScorer(RewardClient.from_config(settings), self.text.add_special_tokens)
        else:
            assert isinstance(self.text, RewardText)
            self.scorer = LocalScorer(self.text, settings.dtype, settings.batch_size, config.rl.micro_batch_tokens,
                                      device)
        self.moments = RunningMoments() if settings.normalize else None
        self.eos_token_id: int | None = None
        if settings.missing_eos_penalty is not None:
            from models.model_io import ensure_model, load_tokenizer

            self.eos_token_id = load_tokenizer(ensure_model(config.model)).eos_token_id

    def describe(self) -> str:
        return self.settings.url or str(self.settings.path)

    def raw_scores(self, trajectory: Trajectory) -> torch.Tensor:
        """(b,) float32 scores of every completion, the first NaN or infinite one
        refused naming its row. A text too long is refused before it is scored (or
        sent), never truncated."""
        batch = trajectory.prompts
        sources = batch.sources or [None] * len(batch.prompts)
        rows = [RowOrigin(row_id, source) for row_id, source in zip(batch.row_ids, sources)]
        texts = [self.text.render(p, c, row.where) for p, c, row in zip(batch.prompts, trajectory.completions, rows)]
        raw = self.scorer.score(texts, self.text.token_ids(texts, rows), rows)
        bad = first_non_finite(raw)
        if bad is not None:
            raise RewardModelError(
                f"the reward model ({self.describe()}) scored {rows[bad].where} as {float(raw[bad])}, completion "
                f"{trajectory.completions[bad]!r}; a NaN or infinite score cannot be trained on. Check the reward "
                "model's dtype (rl.reward.model.dtype=float32) and weights"
            )
        return raw

    def score(self, trajectory: Trajectory, *, training: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
        """Shaped scores (b,) and `reward/model_*` metrics; an evaluation (`training`
        false) leaves the running normalisation as it was (S-OPS-2)."""
        raw = self.raw_scores(trajectory)
        shaped = shape_model_scores(
            raw, self.ended_with_eos(trajectory), self.moments,
            clip=self.settings.clip, missing_eos_penalty=self.settings.missing_eos_penalty,
            weight=self.settings.weight, update=training,
        )
        return shaped.scores, shaped.metrics

    def ended_with_eos(self, trajectory: Trajectory) -> torch.Tensor:
        """(b,) bool: the completion's last token is the policy's EOS."""
        lengths = trajectory.response_mask.sum(dim=1).long()
        if self.eos_token_id is None:
            return torch.ones_like(lengths, dtype=torch.bool)
        last = trajectory.response_ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        return (lengths > 0) & (last == self.eos_token_id)

    def save(self, directory: str) -> dict[str, Any]:
        state = self.moments.state_dict() if self.moments is not None else None
        if state is not None:
            with saving("reward", directory):
                fs, path = fsspec.core.url_to_fs(directory)
                fs.makedirs(path, exist_ok=True)
                write_file(f"{directory}/{MOMENTS_FILE}", json.dumps(state))
        return {"role": "reward", "moments": state}

    def load(self, directory: str) -> dict[str, Any]:
        if self.moments is None:
            return {"moments": None}
        try:
            with fsspec.open(f"{directory}/{MOMENTS_FILE}", "r") as handle:
                self.moments = RunningMoments.from_state(json.load(handle))
        except FileNotFoundError:
            raise RewardModelError(
                f"{directory} holds no {MOMENTS_FILE}: the boundary was written without "
                "rl.reward.model.normalize, so the running normalisation cannot continue; resume with "
                "rl.reward.model.normalize=false or start a new job.name"
            ) from None
        return {"moments": self.moments.state_dict()}

