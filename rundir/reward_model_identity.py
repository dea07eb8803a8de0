"""The reward model's identity facts (S-RM-2): its folder's content fingerprint, what a
server of ours says it serves, and whether the reward role keeps running moments. A
reward model that changes under a run changes what every later reward means; the
boundary records and the resume checks are in rundir/run_identity.py."""

from __future__ import annotations

from pathlib import Path

from configs.schema import PPOConfig, RewardModelConfig
from models.fingerprint import ModelFingerprint, fingerprint_folder


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
