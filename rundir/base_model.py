"""The base model is part of a run's identity (S-SEC-4): every boundary records the
content fingerprint of the model the run started from, and a resume over other
content is refused before any role loads, naming the first file that differs.

The policy's initial weights, the critic's, the reference and a LoRA base all load
`model.path`, so one check covers them.
"""

from __future__ import annotations

import json
from pathlib import Path

import fsspec

from checkpoint.boundary import atomic_write_text
from checkpoint.role_layout import BASE_MODEL_FILE
from configs.loading import ConfigError
from configs.schema import ModelConfig, PPOConfig
from models.fingerprint import ModelFingerprint, fingerprint_folder



def model_folder(model: ModelConfig) -> Path | None:
    """The local folder `model.path` names, or None while a tiny model is not built yet."""
    folder = Path(model.path)
    return folder if (folder / "config.json").is_file() else None


def current_fingerprint(model: ModelConfig, *, build: bool = False) -> ModelFingerprint | None:
    """The fingerprint of the model the roles would load now; with `build`, a tiny
    model not on disk yet is built first (it is deterministic from its spec)."""
    folder = model_folder(model)
    if folder is None and build and model.tiny is not None:
        from models.model_io import ensure_model

        ensure_model(model)
        folder = model_folder(model)
    if folder is None:
        return None
    return fingerprint_folder(folder, revision=model.revision)


def changed_model_problem(
    key: str, path: str, current: ModelFingerprint | None, boundary: str, record: str, recorded_digest: str,
    *, source: str, would: str,
) -> str | None:
    """A resume over a model folder (the base model, a reward model) whose content is not
    what `boundary` recorded in `record`: refused naming the key and the first differing
    file. `source` says how the boundary used the model ("from"), `would` what resuming
    over another would do."""
    if current is None:
        return (
            f"{key}: {path!r} holds no model (no config.json), but {boundary} was trained {source} the model with "
            f"fingerprint {recorded_digest}; resume refused. Put that model back at {key}, or start a new job.name."
        )
    if current.digest == recorded_digest:
        return None
    differs = current.first_difference_from(record, recorded_digest)
    first = f"; first differing file: {differs}" if differs else ""
    return (
        f"{key}: {path!r} now has content fingerprint sha256:{current.short}…, but {boundary} was trained {source} "
        f"sha256:{recorded_digest.removeprefix('sha256:')[:16]}…{first}. Resuming would {would} under this run's "
        f"name; resume refused. Point {key} at the recorded model, or start a new job.name for the new one."
    )


def pin_hub_model(config: PPOConfig) -> PPOConfig:
    """A hub id in `model.path` becomes the local snapshot folder of one commit, so
    every role loads exactly the content that was fingerprinted, whatever the hub's
    branch points at later. The local Hugging Face cache is tried first (no network);
    a cluster's nodes need that cache on shared storage (docs/reliability.md). A hub id
    in `rl.reward.model.path` is pinned the same way (S-RM-2)."""
    model = config.model
    if model.tiny is None and not Path(model.path).exists() and model.path.count("/") == 1:
        folder = hub_snapshot(model.path, model.revision, "model.path")
        pinned = model.model_copy(update={"path": folder, "revision": Path(folder).name})
        config = config.model_copy(update={"model": pinned})
    reward_model = config.rl.reward.model
    if (reward_model is not None and reward_model.path is not None and reward_model.tiny is None
            and not Path(reward_model.path).exists() and reward_model.path.count("/") == 1):
        folder = hub_snapshot(reward_model.path, reward_model.revision, "rl.reward.model.path")
        pinned_rm = reward_model.model_copy(update={"path": folder, "revision": Path(folder).name})
        reward = config.rl.reward.model_copy(update={"model": pinned_rm})
        config = config.model_copy(update={"rl": config.rl.model_copy(update={"reward": reward})})
    return config


def hub_snapshot(repo_id: str, revision: str | None, key: str) -> str:
    """The local snapshot folder of `repo_id` at `revision`: the cache first, then the hub."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, revision=revision, local_files_only=True)
    except Exception:
        try:
            return snapshot_download(repo_id, revision=revision)
        except Exception as error:
            at = f" at revision {revision!r}" if revision else ""
            raise ConfigError([
                f"{key}: {repo_id!r}{at} is neither a local folder nor in the Hugging Face cache, and the "
                f"hub could not provide it ({type(error).__name__}); download it first or name a local folder"
            ]) from None


def record_in_boundary(boundary: str, fingerprint: ModelFingerprint, name: str = BASE_MODEL_FILE) -> str:
    """Write the per-file record `name` into `boundary` (before its marker, which then
    vouches for it) and return the digest for the marker's loop_state."""
    fs, root = fsspec.core.url_to_fs(boundary)
    fs.makedirs(root, exist_ok=True)  # the roles' saves may not have made the folder yet
    record = json.dumps(fingerprint.to_json(), indent=1, sort_keys=True) + "\n"
    atomic_write_text(f"{boundary}/{name}", record)
    return fingerprint.digest
