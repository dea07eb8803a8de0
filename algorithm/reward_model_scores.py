"""From a reward model's raw scores to the terminal reward PPO trains on (S-RM-1):
running normalisation, clipping, the missing-EOS penalty, the weight, and the sum
with a rule's reward. Pure tensor functions and one small state, no model.

Notation: b = batch.

Order, and why: normalise the raw scores (so `clip` is in standard deviations, as in
OpenRLHF's `--reward_clip_range` after `--normalize_reward`), clip, then subtract the
missing-EOS penalty (after clipping, so a clipped score still pays it; TRL's
`missing_eos_penalty` is subtracted from the model's score likewise), then weight.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


@dataclass
class RunningMoments:
    """Mean and variance of every raw score seen so far, merged batch by batch with
    Chan et al.'s parallel update (one pass, no stored history). Kept in each
    boundary so a resumed run normalises exactly as the uninterrupted one."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean

    def update(self, scores: torch.Tensor) -> None:
        """scores (b,): merged into the moments, in float64."""
        values = scores.detach().double()
        n = values.numel()
        if n == 0:
            return
        batch_mean = float(values.mean())
        batch_m2 = float(((values - batch_mean) ** 2).sum())
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        """Population standard deviation; 1.0 until two scores are in (nothing to scale by)."""
        if self.count < 2:
            return 1.0
        return math.sqrt(max(self.m2 / self.count, 0.0))

    def state_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, float | int]) -> "RunningMoments":
        return cls(count=int(state["count"]), mean=float(state["mean"]), m2=float(state["m2"]))


@dataclass(frozen=True)
class ShapedScores:
    scores: torch.Tensor  # (b,) float32: what enters the terminal reward (before the rule's share)
    metrics: dict[str, float]


def shape_model_scores(
    raw: torch.Tensor,
    ended_with_eos: torch.Tensor,
    moments: RunningMoments | None,
    *,
    clip: float | None,
    missing_eos_penalty: float | None,
    weight: float,
    update: bool = True,
) -> ShapedScores:
    """raw (b,) model scores and ended_with_eos (b,) bool -> weighted scores (b,).

    `moments` (None: no normalisation) is updated with this batch first (unless
    `update` is false: an evaluation measures, it never moves the statistics), then
    used: the first batch is normalised by its own statistics, every later one by all
    scores so far. Metrics are `reward/model_*` (docs/reference/metrics.md)."""
    raw = raw.double()
    metrics = {
        "reward/model_raw_mean": float(raw.mean()),
        "reward/model_raw_std": float(raw.std(unbiased=False)) if raw.numel() > 1 else 0.0,
    }
    shaped = raw
    if moments is not None:
        if update:
            moments.update(raw)
        shaped = (raw - moments.mean) / max(moments.std, 1e-8)
        metrics["reward/model_normalized_mean"] = float(shaped.mean())
    if clip is not None:
        clipped = shaped.abs() > clip
        shaped = shaped.clamp(-clip, clip)
        metrics["reward/model_clipped_fraction"] = float(clipped.double().mean())
    if missing_eos_penalty is not None:
        missing = ~ended_with_eos.bool()
        shaped = shaped - missing_eos_penalty * missing.double()
        metrics["reward/model_penalized_fraction"] = float(missing.double().mean())
    shaped = shaped * weight
    metrics["reward/model_score_mean"] = float(shaped.mean())
    return ShapedScores(scores=shaped.float(), metrics=metrics)


def first_non_finite(raw: torch.Tensor) -> int | None:
    """Index of the first NaN or infinite score (b,), or None."""
    bad = (~torch.isfinite(raw)).nonzero()
    return int(bad[0]) if bad.numel() else None
