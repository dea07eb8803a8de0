"""Stopping without losing work, in process (S-STOP-1, S-STOP-3, S-STOP-4): a run past
its time limit, and a run that receives SIGTERM mid-way, each commit the iteration they
finished (with rl.save_every far away) and stop; the rerun ends bitwise equal to the
uninterrupted run, with one metrics row per iteration; a rerun whose rl.max_steps is
below the last committed iteration is refused before anything starts."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from configs.loading import load_config
from flows.in_process import run_in_process
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.support.helpers import metric_records, without_timings

RUN = ["rl.max_steps=3", "rl.save_every=100", "rl.save_final=true"]


def _committed(paths: RunPaths) -> list[str]:
    return sorted(p.parent.name for p in Path(paths.checkpoints).glob("iter_*/_SUCCESS"))


def test_a_time_limit_and_a_sigterm_each_commit_what_finished_and_the_rerun_is_exact(tiny_overrides):
    whole_config = load_config(TINY_PROFILE, tiny_overrides + RUN + ["job.name=whole"])
    whole, whole_roles = run_in_process(whole_config, paths=RunPaths.for_config(whole_config))

    limited = load_config(TINY_PROFILE, tiny_overrides + RUN + ["job.name=stopped", "job.time_limit_minutes=1e-6"])
    paths = RunPaths.for_config(limited)
    run_in_process(limited, paths=paths)
    assert _committed(paths) == ["iter_000001"] and len(metric_records(Path(paths.run_dir))) == 1

    config = load_config(TINY_PROFILE, tiny_overrides + RUN + ["job.name=stopped"])

    def preempt(record: dict) -> None:  # SIGTERM while iteration 2 closes
        if record["iteration"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    run_in_process(config, paths=paths, resume=True, on_iteration=preempt)
    assert _committed(paths) == ["iter_000001", "iter_000002"]
    _, roles = run_in_process(config, paths=paths, resume=True)

    rows = metric_records(Path(paths.run_dir))
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert [without_timings(r) for r in rows] == [without_timings(r) for r in whole]
    theirs = whole_roles.policy.model.state_dict()
    assert all(torch.equal(tensor, theirs[key]) for key, tensor in roles.policy.model.state_dict().items())

    # S-STOP-4: refused by key at the launch (before the Prefect API or Ray start), not a
    # Completed run whose summary reads "3 / 2".
    from flows.launch import plan_launch
    from rundir.resume import ResumeError

    with pytest.raises(ResumeError, match=r"^rl.max_steps=2 is below iteration 3, which .*iter_000003 already"):
        plan_launch(TINY_PROFILE, tiny_overrides + RUN + ["job.name=stopped", "rl.max_steps=2"], None, None,
                    resume=True, resume_from=None)
