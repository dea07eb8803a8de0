"""The reward model is part of a run's identity (S-RM-2), as the base model is
(S-SEC-4): every boundary records its content fingerprint, and a resume over a reward
model with other content is refused before any role loads, naming
`rl.reward.model.path` and the first file that differs. A reward model that changes
under a run changes what every later reward means."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checkpoint.role_layout import REWARD_MODEL_FILE, REWARD_MODEL_KEY
from configs.schema import PPOConfig, RewardModelConfig
from models.fingerprint import ModelFingerprint, fingerprint_folder
from rundir.base_model import changed_model_problem, record_in_boundary


def reward_model_fingerprint(model: RewardModelConfig | None, *, build: bool = False) -> ModelFingerprint | None:
    """The fingerprint of the reward model folder the reward role would load now; with
    `build`, a tiny one not on disk yet is built first (deterministic from its spec)."""
    if model is None or model.path is None:
        return None
    folder = Path(model.path)
    if not (folder / "config.json").is_file() and build and model.tiny is not None:
        from models.reward_model import ensure_reward_model

        ensure_reward_model(model)
    if not (folder / "config.json").is_file():
        return None
    return fingerprint_folder(folder, revision=model.revision)


REWARD_NORMALIZE_KEY = "reward_model_normalize"  # in loop_state when the boundary holds running moments
SERVED_KEY = "reward_model_served"  # in loop_state: the fingerprint a server of ours reported


def served_fingerprint(settings: RewardModelConfig | None) -> str | None:
    """What the server at `rl.reward.model.url` says it serves, by content, when only a
    URL is configured (a `path` is fingerprinted itself); None when it does not say."""
    if settings is None or settings.url is None or settings.path is not None:
        return None
    from models.reward_client import RewardClient

    return RewardClient.from_config(settings).served_fingerprint()


def keeps_reward_state(config: PPOConfig) -> bool:
    """Whether the reward role has state a boundary must keep: the running moments of
    a normalised reward model."""
    return config.rl.reward.model is not None and config.rl.reward.model.normalize


def record_reward_model(boundary: str, fingerprint: ModelFingerprint) -> str:
    """Write the per-file record into `boundary`; returns the digest for loop_state."""
    return record_in_boundary(boundary, fingerprint, REWARD_MODEL_FILE)


def reward_model_problem(marker: dict[str, Any], config: PPOConfig, boundary: str) -> str | None:
    """Why a resume from `boundary` is refused because the reward model changed, or None."""
    loop_state = marker.get("loop_state") or {}
    recorded_digest = loop_state.get(REWARD_MODEL_KEY)
    settings = config.rl.reward.model
    recorded_normalize, configured_normalize = bool(loop_state.get(REWARD_NORMALIZE_KEY)), keeps_reward_state(config)
    if recorded_normalize != configured_normalize:
        return (
            f"rl.reward.model.normalize: {boundary} was written with normalize={str(recorded_normalize).lower()} "
            f"but this run is configured with {str(configured_normalize).lower()}; the running statistics would "
            "start over or be dropped, changing every later reward; resume refused. Resume with the recorded value "
            "or start a new job.name."
        )
    recorded_served = loop_state.get(SERVED_KEY)
    if recorded_served is not None and settings is not None and settings.url is not None:
        current_served = served_fingerprint(settings)
        if current_served is not None and current_served != recorded_served:
            return (
                f"rl.reward.model.url: {settings.url} now serves a reward model with fingerprint "
                f"{current_served[:23]}…, but {boundary} was trained on the rewards of {recorded_served[:23]}…; "
                "resume refused. Serve the recorded model there again, or start a new job.name."
            )
    if recorded_digest is None:
        return None
    if settings is None or settings.path is None:
        return (
            f"rl.reward.model.path: {boundary} was trained on the rewards of a reward model (fingerprint "
            f"{recorded_digest[:23]}…) but this run configures none; resume refused. Configure that reward model "
            "again, or start a new job.name."
        )
    return changed_model_problem(
        "rl.reward.model.path", settings.path, reward_model_fingerprint(settings, build=True), boundary,
        f"{boundary}/{REWARD_MODEL_FILE}", recorded_digest, source="on the rewards of",
        would="optimise another reward",
    )
