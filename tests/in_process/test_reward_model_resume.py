"""S-RM-1, S-RM-2 over boundaries: a run scored by a reward model (normalised, clipped,
its critic started from the reward model) stopped after a committed boundary and run
again ends bitwise equal to the uninterrupted run, running statistics included; a
resume over a changed reward model, or with normalisation switched, is refused by key.

Slow (several short in-process runs): `pytest -m slow tests/in_process/test_reward_model_resume.py`."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from configs.loading import load_config
from flows.in_process import run_in_process
from rundir.resume import ResumeError, resume_boundary
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.support.helpers import boundary, metric_records, weights_digest, without_timings

pytestmark = pytest.mark.slow


def _overrides(root: Path, model_dir: str, reward_dir: Path, name: str, *extra: str) -> list[str]:
    return [
        f"job.output_root={root}", f"model.path={model_dir}", f"job.name={name}", "rl.batch_size=16",
        "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1", "rl.save_every=2", "rl.validation=null",
        "job.trackers=[]", "rl.reward.terminal=exact_match", f"rl.reward.model.path={reward_dir}",
        "rl.reward.model.normalize=true", "rl.reward.model.clip=2.0", "rl.reward.model.max_length=64",
        f"model.critic_path={reward_dir}", *extra,
    ]


def _run(root: Path, model_dir: str, reward_dir: Path, name: str, *extra: str, stop_after: int | None = None) -> Path:
    config = load_config(TINY_PROFILE, _overrides(root, model_dir, reward_dir, name, *extra))
    run_in_process(config, max_steps=stop_after, paths=RunPaths.for_config(config), resume=True)
    return root / name


@pytest.fixture
def reward_dir(tiny_reward_model_dir, tmp_path) -> Path:
    private = tmp_path / "reward-model"
    shutil.copytree(tiny_reward_model_dir, private)
    return private


def test_stop_and_rerun_is_bitwise_the_uninterrupted_run_and_a_changed_reward_model_is_refused(
    tiny_model_dir, reward_dir, tmp_path
):
    straight = _run(tmp_path, tiny_model_dir, reward_dir, "straight", "rl.max_steps=4")
    _run(tmp_path, tiny_model_dir, reward_dir, "resumed", "rl.max_steps=2")
    resumed = _run(tmp_path, tiny_model_dir, reward_dir, "resumed", "rl.max_steps=4")
    for role in ("policy", "critic"):
        assert weights_digest(boundary(resumed, 4) / role) == weights_digest(boundary(straight, 4) / role)
    moments = [json.loads((boundary(run, 4) / "reward" / "reward_moments.json").read_text())
               for run in (straight, resumed)]
    assert moments[0] == moments[1] and moments[0]["count"] == 4 * 16
    rows = [[without_timings(r) for r in metric_records(run)] for run in (straight, resumed)]
    assert rows[0] == rows[1] and [r["iteration"] for r in rows[1]] == [1, 2, 3, 4]
    assert "reward/model_normalized_mean" in rows[1][0] and "reward/fraction_correct" in rows[1][0]

    marker = json.loads((boundary(resumed, 4) / "_SUCCESS").read_text())
    record = json.loads((boundary(resumed, 4) / "reward_model.json").read_text())
    assert marker["loop_state"]["reward_model"] == record["digest"] and "model.safetensors" in record["files"]

    config = load_config(TINY_PROFILE, _overrides(tmp_path, tiny_model_dir, reward_dir, "resumed", "rl.max_steps=6"))
    paths = RunPaths.for_config(config)
    assert resume_boundary(config, paths, resume=True).iteration == 4
    switched = load_config(TINY_PROFILE, _overrides(
        tmp_path, tiny_model_dir, reward_dir, "resumed", "rl.max_steps=6", "rl.reward.model.normalize=false"))
    with pytest.raises(ResumeError, match=r"^rl.reward.model.normalize: .* written with normalize=true"):
        resume_boundary(switched, paths, resume=True)

    weights = load_file(reward_dir / "model.safetensors")
    weights["score.weight"] = weights["score.weight"] + 1e-3
    save_file(weights, reward_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ResumeError) as caught:
        resume_boundary(config, paths, resume=True)
    message = str(caught.value)
    assert message.startswith(f"rl.reward.model.path: {str(reward_dir)!r} now has content fingerprint sha256:")
    assert "first differing file: model.safetensors" in message

    from cli.manifest import validate_manifest  # the pre-flight refuses what the launch refuses (S-BYO-2)

    out, err = io.StringIO(), io.StringIO()
    overrides = _overrides(tmp_path, tiny_model_dir, reward_dir, "resumed", "rl.max_steps=6")
    assert validate_manifest(TINY_PROFILE, overrides, out=out, err=err) == 1
    assert err.getvalue() == f"error: {message}\n"
    assert torch.isfinite(weights["score.weight"]).all()


def test_one_step_off_with_normalised_scores_resumes_bitwise(tiny_model_dir, reward_dir, tmp_path):
    """S-RM-2 with S-ASYNC: the boundary of a one-step-off run holds a batch generated
    but not yet trained; its scores and the running moments they moved must resume as
    the uninterrupted run has them."""
    off = ("rl.max_steps=4", "rl.rollout.max_staleness=1")
    straight = _run(tmp_path, tiny_model_dir, reward_dir, "straight-off", *off)
    _run(tmp_path, tiny_model_dir, reward_dir, "resumed-off", *off, stop_after=2)  # stopped after boundary 2
    resumed = _run(tmp_path, tiny_model_dir, reward_dir, "resumed-off", *off)
    rows = [[without_timings(r) for r in metric_records(run)] for run in (straight, resumed)]
    assert rows[0] == rows[1] and [r["rollout/staleness"] for r in rows[1]] == [0.0, 1.0, 1.0, 1.0]
    moments = [json.loads((boundary(run, 4) / "reward" / "reward_moments.json").read_text())
               for run in (straight, resumed)]
    assert moments[0] == moments[1]
    for role in ("policy", "critic"):
        assert weights_digest(boundary(resumed, 4) / role) == weights_digest(boundary(straight, 4) / role)
