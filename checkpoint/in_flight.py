"""The batch in flight at a one-step-off boundary (S-ASYNC-3): iteration N+1's scored
samples, generated while iteration N trained, saved with boundary N so a resume trains
on exactly them instead of skipping or regenerating them.

Stored as one tensor-only torch file (loaded with weights_only, S-SEC-2): the
dataclasses become tagged dicts and only the classes listed here are rebuilt.
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import fsspec
import torch

from checkpoint.role_files import RoleCheckpointError, read_bytes, torch_load, write_file
from contracts.scored_batch import ScoredBatch
from algorithm.ppo_math import last_action_scores
from contracts.trajectory import PromptBatch, Trajectory, Transcript
from data.packing import MultimodalInputs

IN_FLIGHT_DIR = "in_flight"  # inside the boundary
BATCH_FILE = "batch.pt"
SUMMARY_FILE = "summaries.json"
_CLASSES = {cls.__name__: cls for cls in (Trajectory, PromptBatch, MultimodalInputs, Transcript)}
_TAG = "__dataclass__"


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if _CLASSES.get(name) is not type(value):
            raise TypeError(f"cannot save a {name} in an in-flight batch")
        return {_TAG: name, **{f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value


def _rebuilt(value: Any) -> Any:
    if isinstance(value, dict):
        fields = {key: _rebuilt(item) for key, item in value.items() if key != _TAG}
        if _TAG in value:
            if value[_TAG] == Trajectory.__name__ and "scores" in fields:
                fields = _one_path_fields(fields)
            return _CLASSES[value[_TAG]](**fields)
        return fields
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuilt(item) for item in value)
    return value


def _one_path_fields(old: dict[str, Any]) -> dict[str, Any]:
    """A trajectory saved before every rollout became an episode (S-PATH-1): a terminal
    score (b,) and a shaping term, or an episode's turn rewards and transcript dicts,
    become the per-token scores and action mask the trainers read today, exactly as the
    reward role would have laid them out."""
    fields = dict(old)
    scores, process = fields.pop("scores"), fields.pop("process_rewards", None)
    turn_rewards, episodes = fields.pop("turn_rewards", None), fields.pop("episodes", None)
    action_mask = fields.pop("action_mask", None)
    if action_mask is None:
        action_mask = fields["response_mask"]
    if turn_rewards is not None:
        token_scores = turn_rewards
    else:
        token_scores = last_action_scores(scores, action_mask)
        if process is not None:
            token_scores = token_scores + process
    fields.update(
        action_mask=action_mask, token_scores=token_scores, sequence_scores=scores,
        transcripts=tuple(Transcript(**episode) for episode in episodes or ()),
    )
    return fields


def save_in_flight(directory: str, batch: ScoredBatch[Any]) -> dict[str, Any]:
    """The samples as a torch file; the stage summaries its metrics row will report as JSON."""
    buffer = io.BytesIO()
    torch.save(_plain(batch.trajectory), buffer)
    write_file(f"{directory}/{BATCH_FILE}", buffer.getvalue())
    write_file(f"{directory}/{SUMMARY_FILE}", json.dumps(batch.summaries(), sort_keys=True))
    return {"iteration": batch.trajectory.iteration, "policy_version": batch.trajectory.policy_version}


def load_in_flight(directory: str) -> ScoredBatch[Any]:
    stored = torch_load(f"{directory}/{BATCH_FILE}")
    try:
        batch = ScoredBatch.from_summaries(_rebuilt(stored), json.loads(read_bytes(f"{directory}/{SUMMARY_FILE}")))
    except (KeyError, TypeError, ValueError) as error:
        raise RoleCheckpointError(f"{directory}: the in-flight batch cannot be read back: {error}") from error
    if not isinstance(batch.trajectory, Trajectory):
        raise RoleCheckpointError(f"{directory}/{BATCH_FILE} holds no batch of samples")
    return batch


def holds_in_flight(directory: str) -> bool:
    fs, path = fsspec.core.url_to_fs(f"{directory}/{BATCH_FILE}")
    return fs.exists(path)
