"""Experience files: the samples behind each iteration's numbers (S-OPS-3).

One gzip-compressed JSON-lines file per iteration, `<run>/experience/iter_NNNNNN.jsonl.gz`,
each column of one type so `datasets` reads the files as one table, written whole and
renamed. Resume removes or sets them aside as it does metrics rows (docs/architecture.md,
"What a user sees").
"""

from __future__ import annotations

import gzip
import io
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import fsspec

from files.durable import make_folders, replace_durably, sync_folder

if TYPE_CHECKING:  # the resume check reads experience files before any torch import
    from contracts.trajectory import PPOTargets, Trajectory

@dataclass(frozen=True)
class ExperienceReceipt:
    """What the flow gets back from an experience write: small, whatever the batch size."""

    iteration: int
    path: str
    samples: int
    table: list[dict[str, Any]] = field(default_factory=list)  # the first few rows, for the UI's table
    removed: list[int] = field(default_factory=list)  # iterations whose files retention removed


EXPERIENCE_DIR = "experience"
_FILE = re.compile(r"^iter_(\d{6,})\.jsonl\.gz$")


def experience_file(directory: str, iteration: int) -> str:
    return f"{directory}/iter_{iteration:06d}.jsonl.gz"


def prompt_text(prompt: Any) -> str:
    """A string prompt as it is; a conversation (S-DATA-2) as its JSON text, so the
    column has one type across rows."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def sample_rows(trajectory: Trajectory, targets: PPOTargets) -> list[dict[str, Any]]:
    """One object per sample. `advantage` is the mean over the sample's response tokens
    (what the policy gradient weighs it by), `return` the GAE return at its first
    response token (the value target of the whole completion); the shapes are
    (b,) for scores and (b, r) for advantages, returns and the response mask. With
    several samples per prompt, `group` is the prompt's place among the iteration's."""
    trajectory.require("sequence_scores")
    mask = targets.response_mask
    lengths = mask.sum(dim=1)
    advantages = (targets.advantages * mask).sum(dim=1) / lengths.clamp(min=1.0)  # (b,)
    first_returns = targets.returns[:, 0]
    correct = trajectory.correct.tolist() if trajectory.correct is not None else [None] * len(lengths)
    batch = trajectory.prompts
    rows = [
        {
            "iteration": trajectory.iteration,
            "policy_version": trajectory.policy_version,
            "batch_id": targets.batch_id,
            "row_id": int(batch.row_ids[index]),
            "prompt": prompt_text(batch.prompts[index]),
            "completion": trajectory.completions[index],
            "reference": batch.references[index],
            "reward": float(trajectory.sequence_scores[index]),
            "correct": correct[index],
            "advantage": float(advantages[index]),
            "return": float(first_returns[index]),
            "response_length": int(lengths[index]),
        }
        for index in range(len(trajectory.completions))
    ]
    for row, transcript in zip(rows, trajectory.transcripts):  # S-ENV: what an environment's episode said
        row.update(transcript.row_fields())
    for row, group in zip(rows, batch.group_ids):  # S-OPT-2: several samples per prompt, one group each
        row["group"] = group
    return rows


def transcript_text(messages: list[dict[str, str]]) -> str:
    """A transcript on one line for a table cell: `role: content` turns joined by ` | `."""
    return " | ".join(f"{message['role']}: {message['content']}" for message in messages)


def write_experience(directory: str, iteration: int, rows: list[dict[str, Any]]) -> str:
    """Written whole and renamed, and on disk when this returns (S-CKPT-9): a power cut
    leaves the file whole or absent."""
    make_folders(directory)
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    # No time stamp and no file name in the gzip header: the same samples make the same
    # bytes, so two runs' experience files can be compared byte for byte.
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as handle:
        handle.write(text.encode("utf-8"))
    replace_durably(experience_file(directory, iteration), packed.getvalue())
    return experience_file(directory, iteration)


def experience_iterations(directory: str) -> list[int]:
    """The iterations with an experience file in `directory`, ascending."""
    fs, root = fsspec.core.url_to_fs(directory)
    if not fs.isdir(root):
        return []
    found = [_FILE.match(path.rstrip("/").rsplit("/", 1)[-1]) for path in fs.ls(root, detail=False)]
    return sorted(int(match.group(1)) for match in found if match)


def prune_experience(directory: str, newest: int, keep_last: int) -> list[int]:
    """Remove the files older than the newest `keep_last` iterations; returns those removed."""
    fs, root = fsspec.core.url_to_fs(directory)
    old = [iteration for iteration in experience_iterations(directory) if iteration <= newest - keep_last]
    for iteration in old:
        fs.rm(experience_file(root, iteration))
    return old


def remove_experience_after(directory: str, iteration: int) -> list[int]:
    """A plain resume: the files after the boundary belong to iterations that run again."""
    fs, root = fsspec.core.url_to_fs(directory)
    later = [i for i in experience_iterations(directory) if i > iteration]
    for later_iteration in later:
        fs.rm(experience_file(root, later_iteration))
    if later:
        sync_folder(directory)  # a power cut must not bring back a file of an iteration that runs again
    return later


def set_aside_experience(directory: str, iteration: int, stamp: str) -> str | None:
    """Going back to an earlier boundary (S-FAULT-3): the later files move into
    `after_iter_NNNNNN.<stamp>/` beside them, kept, not deleted. Returns that folder,
    or None when there was nothing after `iteration`."""
    later = [i for i in experience_iterations(directory) if i > iteration]
    if not later:
        return None
    fs, root = fsspec.core.url_to_fs(directory)
    aside = f"{root}/after_iter_{iteration:06d}.{stamp}"
    make_folders(f"{directory}/after_iter_{iteration:06d}.{stamp}")
    for later_iteration in later:
        fs.mv(experience_file(root, later_iteration), experience_file(aside, later_iteration))
    sync_folder(f"{directory}/after_iter_{iteration:06d}.{stamp}")
    sync_folder(directory)
    return f"{directory}/after_iter_{iteration:06d}.{stamp}"

