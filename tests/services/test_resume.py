"""Resume = run the flow again (S-CKPT-2/3/8, S-CW-7..10): exact on CPU, fail-closed on
mismatch, never fooled by an uncommitted boundary, never writing on refusal.

Runs that only set the stage (the uninterrupted references, the run a refusal is
about) are made by the in-process runner (`_seed`): the same iteration program and
role code as the flow (tests/services/test_flow_matches_in_process.py), seconds
instead of an actor start-up each. What is under test (resuming, refusing) goes
through the flow or the CLI. Cases the in-process resume tests and the kill-point
tests already hold are kept under -m slow (test_resume_in_process.py,
test_kill_points.py, test_faults.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint.boundary import CheckpointError
from rundir.resume import ResumeError
from tests.conftest import REPO_ROOT, TINY_PROFILE
from tests.support.helpers import (
    boundary,
    metric_records,
    run_dir_snapshot,
    weights_digest,
    without_timings,
)


def _overrides(root: Path, model_dir: str, *extra: str) -> list[str]:
    return [
        f"job.output_root={root}", f"model.path={model_dir}", "rl.batch_size=16", "rl.minibatch_size=8",
        "rl.micro_batch_size=8", "rl.epochs=1", "rl.save_every=2", "rl.validation=null", *extra,
    ]


def _run(root: Path, model_dir: str, name: str, *extra: str, warmup: int | None = None, resume: bool = True) -> dict:
    from flows.training import ppo

    return ppo(profile=TINY_PROFILE, overrides=_overrides(root, model_dir, *extra),
               critic_warmup_iterations=warmup, run_name=name, resume=resume)


def _seed(root: Path, model_dir: str, name: str, *extra: str, warmup: int = 0, resume: bool = False) -> Path:
    """A run written by the in-process runner, as the flow would write it (resuming
    the one already there with `resume`)."""
    from flows.in_process import run_in_process
    from rundir.run_outputs import RunPaths
    from flows.training import resolve_config

    config = resolve_config(TINY_PROFILE, _overrides(root, model_dir, *extra), warmup, name)
    run_in_process(config, paths=RunPaths.for_config(config), resume=resume)
    return root / name


def _final_digests(run_dir: Path, iteration: int) -> tuple[str, str]:
    return (
        weights_digest(boundary(run_dir, iteration) / "policy"),
        weights_digest(boundary(run_dir, iteration) / "critic"),
    )


@pytest.fixture(scope="module")
def straight_runs(tiny_model_dir, tmp_path_factory) -> dict[int, Path]:
    """Uninterrupted 4-iteration runs, without warmup and with N=2."""
    root = tmp_path_factory.mktemp("straight")
    return {warmup: _seed(root, tiny_model_dir, f"straight{warmup}", "rl.max_steps=4", warmup=warmup)
            for warmup in (0, 2)}


# Both cases are held in process (test_resume_in_process.py: the same roles, resume
# and checkpoint code, run by the other runner), and a flow-level resume by the
# kill-point and dead-actor tests; through the flow they cost two actor start-ups each.
@pytest.mark.slow
@pytest.mark.parametrize("warmup, stop_after", [(0, 2), (2, 1)])
def test_stop_and_rerun_is_bitwise_the_uninterrupted_run(straight_runs, tiny_model_dir, tmp_path, warmup, stop_after):
    _run(tmp_path, tiny_model_dir, "resumed", f"rl.max_steps={stop_after}", warmup=warmup)
    summary = _run(tmp_path, tiny_model_dir, "resumed", "rl.max_steps=4", warmup=warmup)
    assert summary["resumed_from"].endswith(f"iter_{stop_after:06d}")
    resumed, straight = tmp_path / "resumed", straight_runs[warmup]
    assert _final_digests(resumed, 4) == _final_digests(straight, 4)  # S-CKPT-8
    got = [without_timings(r) for r in metric_records(resumed)]
    want = [without_timings(r) for r in metric_records(straight)]
    assert [r["iteration"] for r in got] == [1, 2, 3, 4]
    assert got == want


@pytest.mark.slow  # the same fault as test_kill_points.py's after_train point, with its own Prefect API
def test_sigkill_mid_iteration_then_rerun_resumes_from_the_last_commit(straight_runs, tiny_model_dir, tmp_path):
    """The flow process dies without cleanup inside iteration 3 (after training, before
    the weight sync); boundary 2 is the last commit. Re-running finishes bitwise equal."""
    command = [sys.executable, "-m", "tests.services.faulty_ppo", "--config", TINY_PROFILE, "--",
               *_overrides(tmp_path, tiny_model_dir, "rl.max_steps=4", "job.name=crashed")]
    env = dict(os.environ, PPO_TEST_FAULT="kill:3:after_train")
    log = tmp_path / "killed-run.log"
    with open(log, "w") as output:
        # Own session: the SIGKILLed flow leaves its embedded Prefect API subprocess
        # behind (it holds the output open), so the whole group is reaped afterwards.
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            returncode = process.wait(timeout=600)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert returncode == -9, log.read_text()[-2000:]
    run_dir = tmp_path / "crashed"
    assert (run_dir / "checkpoints" / "latest_checkpoint.txt").read_text().strip() == "iter_000002"
    assert [r["iteration"] for r in metric_records(run_dir)] == [1, 2]

    summary = _run(tmp_path, tiny_model_dir, "crashed", "rl.max_steps=4")
    assert summary["resumed_from"].endswith("iter_000002")
    assert _final_digests(run_dir, 4) == _final_digests(straight_runs[0], 4)
    assert [without_timings(r) for r in metric_records(run_dir)] == [
        without_timings(r) for r in metric_records(straight_runs[0])
    ]


def test_newer_boundary_without_success_is_never_used(straight_runs, tiny_model_dir, tmp_path):
    """The boundary choice is rundir/resume.py's, shared by both runners: held here in
    process (a flow-level resume is in the kill-point and dead-actor tests)."""
    _seed(tmp_path, tiny_model_dir, "partial", "rl.max_steps=2")
    run_dir = tmp_path / "partial"
    # A commit of iteration 4 that died after the role saves, before its marker.
    stale = boundary(run_dir, 4)
    (stale / "policy").mkdir(parents=True)
    (stale / "policy" / "model.safetensors").write_bytes(b"half-written")
    _seed(tmp_path, tiny_model_dir, "partial", "rl.max_steps=4", resume=True)
    assert [r["iteration"] for r in metric_records(run_dir)] == [1, 2, 3, 4]
    assert _final_digests(run_dir, 4) == _final_digests(straight_runs[0], 4)
    assert json.loads((stale / "_SUCCESS").read_text())["iteration"] == 4


def test_resume_under_a_different_warmup_fails_closed_and_writes_nothing(
    prefect_api, ray_cluster, tiny_model_dir, tmp_path
):
    _seed(tmp_path, tiny_model_dir, "mismatch", "rl.max_steps=2", warmup=2)
    before = run_dir_snapshot(tmp_path / "mismatch")
    with pytest.raises(ResumeError) as caught:
        _run(tmp_path, tiny_model_dir, "mismatch", "rl.max_steps=4", warmup=3)
    message = str(caught.value)
    assert "rl.critic_warmup_iterations=2" in message and "configured with 3" in message  # S-CW-9
    assert run_dir_snapshot(tmp_path / "mismatch") == before


def test_cli_refuses_the_warmup_mismatch_before_starting_anything(tiny_model_dir, tmp_path):
    _seed(tmp_path, tiny_model_dir, "climismatch", "rl.max_steps=1", warmup=2)
    command = [sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--",
               *_overrides(tmp_path, tiny_model_dir, "rl.max_steps=4", "job.name=climismatch",
                           "rl.critic_warmup_iterations=3")]
    before = run_dir_snapshot(tmp_path / "climismatch")
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2
    assert "rl.critic_warmup_iterations=2" in result.stderr and "configured with 3" in result.stderr
    assert result.stdout == ""  # refused before the Prefect API, Ray or any actor started
    assert run_dir_snapshot(tmp_path / "climismatch") == before


@pytest.mark.parametrize("damage", ["corrupt_marker", "pointer_to_missing", "truncated_policy"])
def test_damaged_checkpoints_are_refused_clearly_and_left_alone(
    prefect_api, ray_cluster, tiny_model_dir, tmp_path, damage
):
    run_dir = _seed(tmp_path, tiny_model_dir, "damaged", "rl.max_steps=2")
    if damage == "corrupt_marker":
        (boundary(run_dir, 2) / "_SUCCESS").write_text('{"iteration": 2, "role_steps": ')
        expected = r"_SUCCESS is not valid JSON"
    elif damage == "pointer_to_missing":
        (run_dir / "checkpoints" / "latest_checkpoint.txt").write_text("iter_000009\n")
        expected = r"points at iter_000009, which has no _SUCCESS"
    else:  # S-FAULT-3: refused before any actor starts, naming the file and the boundary
        weights = boundary(run_dir, 2) / "policy" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        expected = r"iter_000002: policy/model.safetensors is \d+ bytes, its _SUCCESS records \d+"
    before = run_dir_snapshot(run_dir)
    with pytest.raises(CheckpointError, match=expected):
        _run(tmp_path, tiny_model_dir, "damaged", "rl.max_steps=4")
    assert run_dir_snapshot(run_dir) == before


def test_fresh_start_refuses_to_overwrite_a_committed_run(prefect_api, ray_cluster, tiny_model_dir, tmp_path):
    _seed(tmp_path, tiny_model_dir, "existing", "rl.max_steps=2")
    before = run_dir_snapshot(tmp_path / "existing")
    with pytest.raises(ResumeError, match="refusing to start fresh"):
        _run(tmp_path, tiny_model_dir, "existing", "rl.max_steps=2", resume=False)
    assert run_dir_snapshot(tmp_path / "existing") == before


@pytest.mark.slow  # held in process by test_resume_in_process.py (same roles, same checkpoint code)
@pytest.mark.parametrize("optimizer", ["adamw", "adamw_fused"])
def test_saving_during_warmup_never_changes_the_actor(prefect_api, ray_cluster, tiny_model_dir, tmp_path, optimizer):
    """S-CW-7: save_every=1 (saves at warmup iterations 1 and 2) vs no cadence saves:
    the actor after its first real update (iteration 3) is bitwise the same."""
    common = ("rl.max_steps=3", f"rl.optimizer.name={optimizer}")
    _run(tmp_path, tiny_model_dir, "saving", *common, "rl.save_every=1", warmup=2)
    _run(tmp_path, tiny_model_dir, "silent", *common, "rl.save_every=0", warmup=2)
    assert not boundary(tmp_path / "silent", 1).exists()
    assert weights_digest(boundary(tmp_path / "saving", 3) / "policy") == weights_digest(
        boundary(tmp_path / "silent", 3) / "policy"
    )
