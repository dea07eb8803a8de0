"""Where a run writes: `<output_root>/<job.name>/` with metrics.jsonl and
checkpoints/ (DESIGN.md, "Storage layout of a run")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import fsspec

from files.durable import append_synced, make_folders
from configs.schema import PPOConfig


@dataclass(frozen=True)
class RunPaths:
    run_dir: str

    @classmethod
    def for_config(cls, config: PPOConfig) -> "RunPaths":
        return cls(f"{config.job.output_root.rstrip('/')}/{config.job.name}")

    @property
    def metrics(self) -> str:
        return f"{self.run_dir}/metrics.jsonl"

    @property
    def checkpoints(self) -> str:
        return f"{self.run_dir}/checkpoints"

    @property
    def final_model(self) -> str:
        return f"{self.run_dir}/final_model"

    @property
    def experience(self) -> str:
        """One samples file per iteration (S-OPS-3, contracts/experience.py)."""
        return f"{self.run_dir}/experience"

    @property
    def tensorboard(self) -> str:
        """TensorBoard event files (S-OPS-3); `tensorboard --logdir <output_root>` finds every run's."""
        return f"{self.run_dir}/tensorboard"

    @property
    def artifacts(self) -> str:
        return f"{self.run_dir}/checkpoint_artifacts"

    def ensure(self) -> None:
        make_folders(self.checkpoints)  # durable: the pointer inside must not vanish with its folder


def append_metrics(path: str, record: dict[str, Any]) -> None:
    """One row, on disk when this returns: a committed iteration's row survives a
    power cut with its boundary (S-CKPT-9)."""
    append_synced(path, json.dumps(record, sort_keys=True) + "\n")


def read_metrics(path: str) -> list[dict[str, Any]]:
    try:
        with fsspec.open(path, "r") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []
