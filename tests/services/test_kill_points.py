"""Kill the run at every point of an iteration and of a commit, then rerun (issue 16
item 3, S-FAULT-2): the run ends with the uninterrupted run's weights and train/*
metrics, one metrics row per iteration, and `latest_checkpoint.txt` never names a
boundary without `_SUCCESS`.

The killed run is the documented command in its own process, SIGKILLed by the fault
that tests/services/faulty_ppo.py injects; it joins this session's Prefect API and
Ray cluster, so each case costs its iterations, not a server start. Every point runs under
-m slow: the default suite's kill-then-rerun-exact proof is the killed critic of
tests/services/test_faults.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.services.faulty_ppo import COMMIT_POINTS, FAULT_POINTS
from tests.conftest import REPO_ROOT, TINY_PROFILE
from tests.support.helpers import boundary, metric_records, weights_digest, without_timings

DEFAULT_SUITE: tuple[str, ...] = ()  # see the module docstring
COMMON = ["rl.max_steps=4", "rl.save_every=2", "rl.validation=null"]  # no iteration-0 evaluation row


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    """The run nobody killed, in process (the flow computes exactly this:
    tests/services/test_flow_matches_in_process.py)."""
    from flows.in_process import run_in_process
    from rundir.run_outputs import RunPaths
    from flows.training import resolve_config

    root = tmp_path_factory.mktemp("uninterrupted")
    overrides = _overrides(root, tiny_model_dir, "straight")
    config = resolve_config(TINY_PROFILE, overrides, None, None)
    run_in_process(config, paths=RunPaths.for_config(config))
    return root / "straight"


def _overrides(root, model_dir: str, name: str) -> list[str]:
    return [
        f"job.output_root={root}", f"model.path={model_dir}", f"job.name={name}", "rl.batch_size=16",
        "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1", *COMMON,
    ]


def _pointer_is_committed(run_dir) -> bool:
    pointer = run_dir / "checkpoints" / "latest_checkpoint.txt"
    if not pointer.exists():
        return True
    return (run_dir / "checkpoints" / pointer.read_text().strip() / "_SUCCESS").is_file()


@pytest.mark.parametrize(
    "point", [p if p in DEFAULT_SUITE else pytest.param(p, marks=pytest.mark.slow) for p in FAULT_POINTS]
)
def test_killed_at_a_point_then_rerun_ends_like_the_uninterrupted_run(
    point, uninterrupted, prefect_api, ray_cluster, reused_role_processes, tiny_model_dir, tmp_path
):
    import ray
    from prefect.settings import PREFECT_API_URL

    from flows.training import ppo

    at = 2 if point in COMMIT_POINTS else 3  # iteration 2 commits (rl.save_every=2)
    overrides = _overrides(tmp_path, tiny_model_dir, "killed")
    env = {
        **os.environ, "PPO_TEST_FAULT": f"kill:{at}:{point}", "PREFECT_API_URL": PREFECT_API_URL.value(),
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
    }
    killed = subprocess.run(
        [sys.executable, "-m", "tests.services.faulty_ppo", "--config", TINY_PROFILE, "--", *overrides],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    run_dir = tmp_path / "killed"
    assert _pointer_is_committed(run_dir)

    summary = ppo(profile=TINY_PROFILE, overrides=overrides)
    assert summary["policy_version"] == 4 and _pointer_is_committed(run_dir)
    for role in ("policy", "critic"):
        assert weights_digest(boundary(run_dir, 4) / role) == weights_digest(boundary(uninterrupted, 4) / role)
    got = [without_timings(r) for r in metric_records(run_dir)]
    assert [r["iteration"] for r in got] == [1, 2, 3, 4]  # one row per iteration
    assert got == [without_timings(r) for r in metric_records(uninterrupted)]
    marker = json.loads((boundary(run_dir, 4) / "_SUCCESS").read_text())
    assert "metrics_row.json" in marker["files"]  # the row the boundary keeps is vouched for
