"""Resume through the in-process runner (flows/in_process.py): the flow's own resume
code (flows/resume.py) and iteration program on role objects, no Prefect, no Ray.
These hold the resume contract (S-CKPT-8, S-CW-7..9) in seconds per case; the flow
runs of tests/integration/test_resume.py hold it over actors."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.loading import load_config
from flows.in_process import run_in_process
from flows.resume import ResumeError
from flows.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.integration.helpers import boundary, metric_records, run_dir_snapshot, weights_digest, without_timings


def _config(root: Path, model_dir: str, name: str, *extra: str):
    return load_config(TINY_PROFILE, [
        f"job.output_root={root}", f"model.path={model_dir}", f"job.name={name}", "rl.batch_size=16",
        "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1", "rl.save_every=2", *extra,
    ])


def _run(root: Path, model_dir: str, name: str, *extra: str, resume: bool = True) -> Path:
    config = _config(root, model_dir, name, *extra)
    run_in_process(config, paths=RunPaths.for_config(config), resume=resume)
    return root / name


def _digests(run_dir: Path, iteration: int) -> tuple[str, str]:
    return tuple(weights_digest(boundary(run_dir, iteration) / role) for role in ("policy", "critic"))


@pytest.mark.parametrize("warmup, stop_after", [(0, 2), (2, 1), (2, 3)])
def test_stop_and_rerun_in_process_is_bitwise_the_uninterrupted_run(tiny_model_dir, tmp_path, warmup, stop_after):
    common = (f"rl.critic_warmup_iterations={warmup}",)
    straight = _run(tmp_path, tiny_model_dir, "straight", "rl.max_steps=4", *common)
    _run(tmp_path, tiny_model_dir, "resumed", f"rl.max_steps={stop_after}", *common)
    resumed = _run(tmp_path, tiny_model_dir, "resumed", "rl.max_steps=4", *common)
    assert _digests(resumed, 4) == _digests(straight, 4)  # S-CKPT-8, through warmup too (S-CW-9)
    got = [without_timings(r) for r in metric_records(resumed)]
    assert [r["iteration"] for r in got] == [1, 2, 3, 4]  # rows after the boundary were replayed once
    assert got == [without_timings(r) for r in metric_records(straight)]


def test_resume_under_a_different_warmup_fails_closed_and_writes_nothing(tiny_model_dir, tmp_path):
    run_dir = _run(tmp_path, tiny_model_dir, "mismatch", "rl.max_steps=2", "rl.critic_warmup_iterations=2")
    before = run_dir_snapshot(run_dir)
    with pytest.raises(ResumeError, match=r"rl.critic_warmup_iterations=2 .*configured with 3"):
        _run(tmp_path, tiny_model_dir, "mismatch", "rl.max_steps=4", "rl.critic_warmup_iterations=3")
    assert run_dir_snapshot(run_dir) == before


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_fused"])
def test_saving_during_warmup_never_changes_the_actor(tiny_model_dir, tmp_path, optimizer):
    """S-CW-7: saves at warmup iterations 1 and 2 vs none: the actor after its first
    real update (iteration 3) is bitwise the same."""
    common = ("rl.max_steps=3", f"rl.optimizer.name={optimizer}", "rl.critic_warmup_iterations=2")
    saving = _run(tmp_path, tiny_model_dir, "saving", *common, "rl.save_every=1")
    silent = _run(tmp_path, tiny_model_dir, "silent", *common, "rl.save_every=0")
    assert boundary(saving, 1).exists() and not boundary(silent, 1).exists()
    assert weights_digest(boundary(saving, 3) / "policy") == weights_digest(boundary(silent, 3) / "policy")
