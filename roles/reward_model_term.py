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
from models.reward_model import RewardModelError, RewardModelScorer, RowOrigin, ensure_reward_model

MOMENTS_FILE = "reward_moments.json"


class RewardModelTerm:
    def __init__(self, config: PPOConfig, device: str = "cpu"):
        settings = config.rl.reward.model
        assert settings is not None
        self.settings = settings
        self.device = device
        folder = ensure_reward_model(settings)
        self.scorer = (
            RewardModelScorer(folder, settings.dtype, settings.batch_size, settings.max_length,
                              load_model=settings.url is None, micro_batch_tokens=config.rl.micro_batch_tokens)
            if folder is not None else None
        )
        if self.scorer is not None and self.scorer.model is not None and device != "cpu":
            self.scorer.model.to(device)  # frozen and never parked: it stays there for the run
        self.client = None
        if settings.url is not None:
            from models.reward_client import RewardClient

            self.client = RewardClient.from_config(settings)
        self.moments = RunningMoments() if settings.normalize else None
        self.eos_token_id: int | None = None
        if settings.missing_eos_penalty is not None:
            from models.model_io import ensure_model, load_tokenizer

            self.eos_token_id = load_tokenizer(ensure_model(config.model)).eos_token_id

    def describe(self) -> str:
        return self.settings.url or str(self.settings.path)

    def raw_scores(self, trajectory: Trajectory) -> torch.Tensor:
        """(b,) float32 scores of every completion, the first NaN or infinite one
        refused naming its row."""
        batch = trajectory.prompts
        sources = batch.sources or [None] * len(batch.prompts)
        rows = [RowOrigin(row_id, source) for row_id, source in zip(batch.row_ids, sources)]
        if self.scorer is not None:
            texts = [
                self.scorer.render(p, c, f"row {row.row_id}" + (f" ({row.source})" if row.source else ""))
                for p, c, row in zip(batch.prompts, trajectory.completions, rows)
            ]
        else:
            texts = [_plain_text(p, c) for p, c in zip(batch.prompts, trajectory.completions)]
        if self.client is not None:
            if self.scorer is not None:
                self.scorer.token_ids(texts, rows)  # S-RM-1: refused before sending, never truncated by the server
            templated = self.scorer is not None and self.scorer.has_chat_template
            raw = self.client.score(texts, rows, add_special_tokens=not templated)
        else:
            assert self.scorer is not None
            raw = self.scorer.score_ids(self.scorer.token_ids(texts, rows))
        bad = first_non_finite(raw)
        if bad is not None:
            row = rows[bad]
            where = f"row {row.row_id}" + (f" ({row.source})" if row.source else "")
            raise RewardModelError(
                f"the reward model ({self.describe()}) scored {where} as {float(raw[bad])}, completion "
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


def _plain_text(prompt: Any, completion: str) -> str:
    if not isinstance(prompt, str):
        raise RewardModelError(
            "rl.reward.model.url: a conversation prompt needs the reward model's chat template; set "
            "rl.reward.model.path to the served model's folder (its tokenizer renders the prompt)"
        )
    return prompt + completion
