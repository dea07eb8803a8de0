"""What a generated batch must be before anything trains on it: exactly the rows it
was asked for, in order, each with at least one response token and a finite log-prob
on every response token. A failed or aborted generation must fail the rollout by name,
never reach the trainers as a zero-reward row."""

from __future__ import annotations

from typing import Sequence

import torch

from contracts.trajectory import Trajectory


class GeneratedRowError(RuntimeError):
    """A generated batch that does not hold the rows it was asked for, or holds an empty
    or non-finite one."""


class AbortedGeneration(GeneratedRowError):
    """The engine gave up on one request (vLLM's finish_reason "abort"): `position` is
    its place in the engine's batch, which the rollout role turns into the row id."""

    def __init__(self, position: int):
        self.position = position
        super().__init__(f"the engine aborted the request at batch position {position}")


def check_generated(trajectory: Trajectory, row_ids: Sequence[int]) -> None:
    """Refuse `trajectory` unless it carries `row_ids` in order, every row with a token."""
    got = list(trajectory.prompts.row_ids)
    if got != list(row_ids):
        missing = sorted(set(row_ids) - set(got))
        extra = sorted(set(got) - set(row_ids))
        raise GeneratedRowError(
            f"iteration {trajectory.iteration}: the generated batch holds rows other than the batch asked for "
            f"(missing {missing[:5]}, not asked for {extra[:5]}, {len(got)} rows for {len(row_ids)})"
        )
    lengths = trajectory.response_mask.sum(dim=1)
    finite = torch.isfinite(trajectory.rollout_logprobs) | (trajectory.response_mask == 0)
    for position, row in enumerate(got):
        if lengths[position] < 1:
            raise GeneratedRowError(
                f"iteration {trajectory.iteration}: row {row} (batch position {position}) came back with no "
                "response token"
            )
        if not bool(finite[position].all()):
            raise GeneratedRowError(
                f"iteration {trajectory.iteration}: row {row} (batch position {position}) has a non-finite "
                "log-prob on a response token"
            )
