"""Runs that several integration tests read: each is made once per test session,
because starting a run's seven actors is most of what such a test costs (issue 19)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import TINY_PROFILE, short_run_overrides


@dataclass(frozen=True)
class FinishedRun:
    run_dir: Path
    overrides: list[str]
    summary: dict


@pytest.fixture(scope="session")
def golden_run(prefect_api, ray_cluster, tiny_model_dir, tmp_path_factory) -> FinishedRun:
    """Three iterations through the `ppo` flow (real Prefect, real Ray actors), no
    warmup, committing at iteration 2 (the cadence) and 3 (the end), in two block
    subflows (`iterations 1-2`, `iteration 3`). Tests only read it; none may write
    into its directory."""
    from flows.training import ppo

    root = tmp_path_factory.mktemp("golden")
    overrides = short_run_overrides(root, tiny_model_dir) + [
        "rl.max_steps=3", "rl.save_every=2", "job.name=golden",
        "job.iterations_per_block=2",
    ]
    summary = ppo(profile=TINY_PROFILE, overrides=overrides, critic_warmup_iterations=0)
    return FinishedRun(root / "golden", overrides, summary)
