"""What a run is, as every boundary records it and every resume checks it: one entry per
loop-state key, with how it is recorded and how it is checked side by side (S-CKPT-4,
S-ASYNC-3, S-LORA-2, S-SEC-4, S-RM-1, S-RM-2, S-OPT-2).

The commit records the whole identity with `record_identity`, the resume checks it with
`identity_problem`. A served reward model's fingerprint is read once, when the run is
launched (`RunIdentity.at_launch`), and carried with it: no commit talks to a server,
so a server that blinks between two commits cannot fail a commit outside any stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import fsspec

from checkpoint.role_layout import BASE_MODEL_FILE, BASE_MODEL_KEY, REWARD_MODEL_FILE, REWARD_MODEL_KEY
from configs.schema import PPOConfig
from models.fingerprint import ModelFingerprint
from models.lora_targets import ADAPTER_CONFIG_FILE
from rundir.base_model import changed_model_problem, current_fingerprint, record_in_boundary
from rundir.resume_log import resume_logger
from rundir.reward_model_identity import keeps_reward_state, reward_model_fingerprint, served_fingerprint

ESTIMATOR_KEY = "advantage_estimator"
WARMUP_KEY = "critic_warmup_iterations"
STALENESS_KEY = "max_staleness"
LORA_KEY = "lora"
REWARD_NORMALIZE_KEY = "reward_model_normalize"  # present when the boundary holds running moments
SERVED_KEY = "reward_model_served"  # the fingerprint a server of ours reported

OMIT = object()
"""A record function's answer when its key is absent from this run's loop state (absent
means the old default: synchronous, full fine-tuning, gae, no reward model)."""


@dataclass
class RunIdentity:
    """One run's identity facts. The served fingerprint is read at launch; the model
    folders' fingerprints when first asked (a tiny model is built by its roles, so at
    the first commit) and kept for the run's later commits."""

    config: PPOConfig
    served: str | None = None
    _fingerprints: dict[str, ModelFingerprint | None] = field(default_factory=dict, repr=False)

    @classmethod
    def at_launch(cls, config: PPOConfig) -> "RunIdentity":
        return cls(config, served_fingerprint(config.rl.reward.model))

    def base_model(self, *, build: bool = False) -> ModelFingerprint | None:
        if self._fingerprints.get("base") is None:
            self._fingerprints["base"] = current_fingerprint(self.config.model, build=build)
        return self._fingerprints["base"]

    def reward_model(self, *, build: bool = False) -> ModelFingerprint | None:
        if self._fingerprints.get("reward") is None:
            self._fingerprints["reward"] = reward_model_fingerprint(self.config.rl.reward.model, build=build)
        return self._fingerprints["reward"]


Check = Callable[[dict[str, Any], RunIdentity, str], "str | None"]
"""(the boundary's loop state, this run, the boundary) -> why the resume is refused, or None."""


@dataclass(frozen=True)
class IdentityEntry:
    key: str  # the loop-state key
    record: Callable[[RunIdentity, str], Any]  # (this run, the boundary being committed) -> value, or OMIT
    check: Check


def _refused(boundary: str, key: str, recorded: Any, configured: Any) -> str:
    return (
        f"{boundary} was written with {key}={recorded} but this run is configured with {key}={configured}; "
        f"resume refused. Resume with {key}={recorded} or start a new job.name."
    )


# --- the entries: record, then check --------------------------------------------------------


def _record_staleness(identity: RunIdentity, boundary: str) -> Any:
    lag = identity.config.rl.rollout.max_staleness
    return lag if lag else OMIT  # recorded one step off only


def _check_staleness(loop_state: dict[str, Any], identity: RunIdentity, boundary: str) -> str | None:
    recorded, configured = loop_state.get(STALENESS_KEY, 0), identity.config.rl.rollout.max_staleness
    if recorded <= configured:
        return None
    return (  # its next batch, held in flight, would be dropped
        f"{boundary} was written one step off (rl.rollout.max_staleness={recorded}) and holds the next "
        f"iteration's batch in flight, but this run is configured with rl.rollout.max_staleness={configured}, "
        f"which would skip that batch; resume refused. Resume with rl.rollout.max_staleness={recorded} or start "
        "a new job.name."
    )


def _record_estimator(identity: RunIdentity, boundary: str) -> Any:
    estimator = identity.config.rl.advantage_estimator
    return estimator if estimator != "gae" else OMIT


def _check_estimator(loop_state: dict[str, Any], identity: RunIdentity, boundary: str) -> str | None:
    recorded, configured = loop_state.get(ESTIMATOR_KEY, "gae"), identity.config.rl.advantage_estimator
    return None if recorded == configured else _refused(boundary, "rl.advantage_estimator", recorded, configured)


def _record_lora(identity: RunIdentity, boundary: str) -> Any:
    lora = identity.config.model.lora
    return lora.record if lora.enabled else OMIT


def _check_lora(loop_state: dict[str, Any], identity: RunIdentity, boundary: str) -> str | None:
    lora = identity.config.model.lora
    recorded, configured = loop_state.get(LORA_KEY), lora.record if lora.enabled else None
    if recorded is None and _has_adapters(boundary):
        # Adapters from before the marker recorded them: the roles' load compares the weights instead.
        resume_logger().warning(f"{boundary} records no model.lora; its adapters are checked as the roles load them")
        return None
    if recorded == configured:
        return None
    off = "rank=0 (off: full fine-tuning)"
    return (
        f"{boundary} was written with model.lora {recorded or off} but this run is configured with "
        f"model.lora {configured or off}; resume refused. Resume with the recorded model.lora or start "
        "a new job.name."
    )


def _has_adapters(boundary: str) -> bool:
    fs, root = fsspec.core.url_to_fs(boundary)
    return fs.exists(f"{root}/policy/{ADAPTER_CONFIG_FILE}")


def _record_warmup(identity: RunIdentity, boundary: str) -> Any:
    return identity.config.rl.critic_warmup_iterations


def _check_warmup(loop_state: dict[str, Any], identity: RunIdentity, boundary: str) -> str | None:
    configured = identity.config.rl.critic_warmup_iterations
    if WARMUP_KEY not in loop_state:
        # S-CW-10: unknown, not a mismatch; the derived policy_version check still runs.
        resume_logger().warning(
            f"{boundary} records no critic_warmup_iterations; the configured value {configured} could not be verified"
        )
        return None
    recorded = loop_state[WARMUP_KEY]
    if recorded == configured:
        return None
    return (
        f"{boundary} was written with rl.critic_warmup_iterations={recorded} but this run is configured "
        f"with {configured}; resume refused. Use the recorded value or start a new job.name."
    )


def _record_base_model(identity: RunIdentity, boundary: str) -> Any:
    fingerprint = identity.base_model()
    return OMIT if fingerprint is None else record_in_boundary(boundary, fingerprint)


def _check_base_model(loop_state: dict[str, Any], identity: RunIdentity, boundary: str) -> str | None:
    """Before any role loads the model; a boundary from before the record is not refused."""
    recorded = loop_state.get(BASE_MODEL_KEY)
    if recorded is None:
        return None
    config = identity.config
    return changed_model_problem(
        "model.path", config.model.path, identity.base_model(build=True), boundary,
        f"{boundary}/{BASE_MODEL_FILE}", recorded, source="from", would="train another model",
    )


def _record_normalize(identity: RunIdentity, boundary: str) -> Any:
    return True if keeps_reward_state(identity.config) else OMIT


def _check_normalize(loop_state: dict[str, Any], identity: RunIdentity, boundary: str) -> str | None:
    recorded, configured = bool(loop_state.get(REWARD_NORMALIZE_KEY)), keeps_reward_state(identity.config)
    if recorded == configured:
        return None
    return (
        f"rl.reward.model.normalize: {boundary} was written with normalize={str(recorded).lower()} "
        f"but this run is configured with {str(configured).lower()}; the running statistics would "
        "start over or be dropped, changing every later reward; resume refused. Resume with the recorded value "
        "or start a new job.name."
    )


def _record_served(identity: RunIdentity, boundary: str) -> Any:
    return OMIT if identity.served is None else identity.served


def _check_served(loop_state: dict[str, Any], identity: RunIdentity, boundary: str) -> str | None:
    recorded, settings = loop_state.get(SERVED_KEY), identity.config.rl.reward.model
    if recorded is None or settings is None or settings.url is None:
        return None
    if identity.served is None or identity.served == recorded:
        return None
    return (
        f"rl.reward.model.url: {settings.url} now serves a reward model with fingerprint "
        f"{identity.served[:23]}…, but {boundary} was trained on the rewards of {recorded[:23]}…; "
        "resume refused. Serve the recorded model there again, or start a new job.name."
    )


def _record_reward_model(identity: RunIdentity, boundary: str) -> Any:
    fingerprint = identity.reward_model()
    return OMIT if fingerprint is None else record_in_boundary(boundary, fingerprint, REWARD_MODEL_FILE)


def _check_reward_model(loop_state: dict[str, Any], identity: RunIdentity, boundary: str) -> str | None:
    recorded, settings = loop_state.get(REWARD_MODEL_KEY), identity.config.rl.reward.model
    if recorded is None:
        return None
    if settings is None or settings.path is None:
        return (
            f"rl.reward.model.path: {boundary} was trained on the rewards of a reward model (fingerprint "
            f"{recorded[:23]}…) but this run configures none; resume refused. Configure that reward model "
            "again, or start a new job.name."
        )
    return changed_model_problem(
        "rl.reward.model.path", settings.path, identity.reward_model(build=True), boundary,
        f"{boundary}/{REWARD_MODEL_FILE}", recorded, source="on the rewards of", would="optimise another reward",
    )


IDENTITY: tuple[IdentityEntry, ...] = (
    IdentityEntry(STALENESS_KEY, _record_staleness, _check_staleness),  # S-ASYNC-3
    IdentityEntry(ESTIMATOR_KEY, _record_estimator, _check_estimator),  # S-OPT-2
    IdentityEntry(LORA_KEY, _record_lora, _check_lora),  # S-LORA-2
    IdentityEntry(WARMUP_KEY, _record_warmup, _check_warmup),  # S-CKPT-4, S-CW-10
    IdentityEntry(BASE_MODEL_KEY, _record_base_model, _check_base_model),  # S-SEC-4
    IdentityEntry(REWARD_NORMALIZE_KEY, _record_normalize, _check_normalize),  # S-RM-1
    IdentityEntry(SERVED_KEY, _record_served, _check_served),  # S-RM-2
    IdentityEntry(REWARD_MODEL_KEY, _record_reward_model, _check_reward_model),  # S-RM-2
)
"""In the order a resume checks them: the config's own keys first, then the model
folders, whose fingerprints may build a tiny model."""


def record_identity(identity: RunIdentity, boundary: str) -> dict[str, Any]:
    """The loop state a commit of `boundary` records (writing the model records into it)."""
    recorded = {entry.key: entry.record(identity, boundary) for entry in IDENTITY}
    return {key: value for key, value in recorded.items() if value is not OMIT}


def identity_problem(marker: dict[str, Any], identity: RunIdentity, boundary: str) -> str | None:
    """Why resuming this run from `boundary` is refused, or None: the first entry that
    does not match."""
    loop_state = marker.get("loop_state") or {}
    for entry in IDENTITY:
        problem = entry.check(loop_state, identity, boundary)
        if problem is not None:
            return problem
    return None
