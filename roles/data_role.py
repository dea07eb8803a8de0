"""The data role: projected prompts and the cursor that makes resume exact (S-DATA-6)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import fsspec
import torch

from checkpoint.role_files import saving, write_file
from configs.code_folders import use_run_code_dirs
from configs.schema import DataConfig, PPOConfig
from algorithm.rewards import resolve_terminal
from data.prompt_projection import project_prompt, project_reference, reference_key_for
from data.sources import iter_source_rows
from contracts.trajectory import PromptBatch
from placement.role_placement import RolePlacement


@dataclass
class DataCursor:
    epoch: int = 0
    position: int = 0
    shuffle_seed: int = 0


@dataclass(frozen=True)
class ProjectedRow:
    prompt: Any
    reference: str | None
    metadata: dict[str, Any]
    where: str


def load_rows(
    data: DataConfig, reference_required: bool, key: str, trusted: Iterable[str] = ()
) -> list[ProjectedRow]:
    """Every row of a source, projected while loading, row 0 first, so a bad file fails
    when the role is built, before any model is trained (S-DATA-5)."""
    rows: list[ProjectedRow] = []
    for sourced in iter_source_rows(data, key, trusted):
        prompt = project_prompt(sourced.value, prompt_key=data.prompt_key, where=sourced.where)
        reference_key = reference_key_for(sourced.value, data.reference_key, required=reference_required)
        reference = project_reference(sourced.value, reference_key=reference_key, where=sourced.where)
        metadata = {k: v for k, v in sourced.value.items() if k not in (data.prompt_key, data.reference_key)}
        rows.append(ProjectedRow(prompt, reference, metadata, sourced.where))
    if not rows:
        raise ValueError(f"{key}: the source yielded no rows")
    return rows


class DataRole:
    def __init__(self, config: PPOConfig, placement: RolePlacement | None = None):
        """`placement`: always the host's (the data role holds no model)."""
        use_run_code_dirs()  # S-BYO-3: a row factory or reward beside the profile
        data = config.rl.data
        trusted = config.job.trusted_modules
        matcher = resolve_terminal(config.rl.reward.terminal, config.rl.reward.terminal_callable, trusted)
        reference_required = matcher is not None and matcher.needs_reference
        self.rows = load_rows(data, reference_required, "rl.data", trusted)
        self.shuffle = data.shuffle
        self.cursor = DataCursor(shuffle_seed=config.job.seed)
        self._order = self._epoch_order(0)
        # S-OPS-2: the evaluation set is fixed for the whole run and never moves the
        # cursor, so evaluating cannot change which prompts training sees.
        self.validation_rows: list[ProjectedRow] = []
        validation = config.rl.validation
        if validation is not None:
            rows = load_rows(validation.data, reference_required, "rl.validation.data", trusted)
            if validation.data.shuffle:
                generator = torch.Generator().manual_seed(config.job.seed * 7919 + 104_729)
                rows = [rows[i] for i in torch.randperm(len(rows), generator=generator).tolist()]
            self.validation_rows = rows[: validation.num_prompts]

    def ready(self) -> dict[str, Any]:
        return {"role": "data", "rows": len(self.rows), "validation_rows": len(self.validation_rows)}

    def validation_batch(self, iteration: int) -> PromptBatch:
        """The evaluation prompts, the same ones at every evaluation (row ids index the
        evaluation source, not rl.data)."""
        if not self.validation_rows:
            raise RuntimeError("evaluation asked for, but rl.validation is not configured")
        rows = self.validation_rows
        return PromptBatch(
            iteration=iteration,
            prompts=[r.prompt for r in rows],
            references=[r.reference for r in rows],
            metadata=[r.metadata for r in rows],
            row_ids=list(range(len(rows))),
            sources=[r.where for r in rows],
        )

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.rows)))
        generator = torch.Generator().manual_seed(self.cursor.shuffle_seed * 7919 + epoch)
        return torch.randperm(len(self.rows), generator=generator).tolist()

    def next_batch(
        self, iteration: int, batch_size: int, samples_per_prompt: int = 1
    ) -> tuple[PromptBatch, dict[str, float]]:
        """The next `batch_size` prompts, each repeated `samples_per_prompt` times side by
        side with its position as group id (S-OPT-2). The cursor counts prompts, so a
        resume continues where it stopped whatever the samples per prompt."""
        row_ids: list[int] = []
        while len(row_ids) < batch_size:
            if self.cursor.position >= len(self._order):
                self.cursor.epoch += 1
                self.cursor.position = 0
                self._order = self._epoch_order(self.cursor.epoch)
            take = min(batch_size - len(row_ids), len(self._order) - self.cursor.position)
            row_ids.extend(self._order[self.cursor.position : self.cursor.position + take])
            self.cursor.position += take
        group_ids: list[int] = []
        if samples_per_prompt > 1:  # the one place a prompt becomes several samples
            group_ids = [group for group in range(len(row_ids)) for _ in range(samples_per_prompt)]
            row_ids = [row_ids[group] for group in group_ids]
        rows = [self.rows[i] for i in row_ids]
        batch = PromptBatch(
            iteration=iteration,
            prompts=[r.prompt for r in rows],
            references=[r.reference for r in rows],
            metadata=[r.metadata for r in rows],
            row_ids=row_ids,
            sources=[r.where for r in rows],
            group_ids=group_ids,
        )
        return batch, {"data/epoch": float(self.cursor.epoch), "data/position": float(self.cursor.position)}

    # -- checkpoint -------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return asdict(self.cursor)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.cursor = DataCursor(**state)
        self._order = self._epoch_order(self.cursor.epoch)

    def save(self, directory: str) -> dict[str, Any]:
        with saving("data", directory):
            fs, path = fsspec.core.url_to_fs(directory)
            fs.makedirs(path, exist_ok=True)
            write_file(f"{directory}/cursor.json", json.dumps(self.state_dict()))
        return {"role": "data", "cursor": self.state_dict()}

    def load(self, directory: str) -> dict[str, Any]:
        with fsspec.open(f"{directory}/cursor.json", "r") as handle:
            self.load_state_dict(json.load(handle))
        return {"role": "data", "cursor": self.state_dict()}
