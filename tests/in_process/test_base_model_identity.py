"""S-SEC-4: a run records the content fingerprint of its base model in every boundary,
and a resume over other content (another model at model.path, or one tensor changed
in place) is refused before any role loads, naming the path, both fingerprints and
the first file that differs."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from configs.loading import load_config
from flows.in_process import run_in_process
from rundir.resume import ResumeError, resume_boundary
from rundir.run_outputs import RunPaths
from tests.conftest import REPO_ROOT, TINY_PROFILE, short_run_overrides


@pytest.fixture
def committed_run(tiny_model_dir, tmp_path):
    """One committed iteration trained from a private copy of the tiny model."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    overrides = short_run_overrides(tmp_path / "outputs", str(model)) + [
        "job.name=identity", "rl.max_steps=1", "rl.save_every=1", "job.trackers=[]", "job.experience.keep=off",
    ]
    config = load_config(TINY_PROFILE, overrides)
    run_in_process(config, paths=RunPaths.for_config(config))
    return config, model, overrides


def test_a_resume_over_other_content_is_refused_by_name(committed_run, tmp_path):
    config, model, overrides = committed_run
    paths = RunPaths.for_config(config)
    boundary = Path(paths.checkpoints) / "iter_000001"
    recorded = json.loads((boundary / "_SUCCESS").read_text())["loop_state"]["base_model"]
    record = json.loads((boundary / "base_model.json").read_text())
    assert record["digest"] == recorded and "model.safetensors" in record["files"]
    assert resume_boundary(config, paths, resume=True).iteration == 1  # the same content resumes

    # One tensor changed in place.
    weights = load_file(model / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ResumeError) as caught:
        resume_boundary(config, paths, resume=True)
    message = str(caught.value)
    assert message.startswith(f"model.path: {str(model)!r} now has content fingerprint sha256:")
    assert f"trained from sha256:{recorded.removeprefix('sha256:')[:16]}" in message
    assert "first differing file: model.safetensors" in message and "new job.name" in message

    # --validate-manifest refuses what the launch refuses (S-BYO-2; it said bind_check: ok).
    from cli.manifest import validate_manifest

    out, err = io.StringIO(), io.StringIO()
    assert validate_manifest(TINY_PROFILE, overrides, out=out, err=err) == 1
    assert err.getvalue() == f"error: {message}\n" and "bind_check: failed (1 problem(s)" in out.getvalue()

    # The command line refuses it before Prefect, Ray or any role starts (exit 2).
    started = subprocess.run(
        [sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--", *overrides],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""},
    )
    assert started.returncode == 2, started.stderr
    assert started.stderr.startswith("error: model.path:") and "model.safetensors" in started.stderr
    assert started.stdout == ""  # nothing started


def test_the_fingerprint_cache_notices_an_edit(tmp_path):
    from models.fingerprint import FingerprintCache, fingerprint_folder

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    torch.manual_seed(0)
    save_file({"w": torch.zeros(4)}, tmp_path / "m" / "model.safetensors")
    cache = FingerprintCache(tmp_path / "cache.json")
    first = fingerprint_folder(tmp_path / "m", cache=cache)
    assert fingerprint_folder(tmp_path / "m", cache=FingerprintCache(tmp_path / "cache.json")) == first
    save_file({"w": torch.ones(4)}, tmp_path / "m" / "model.safetensors")  # same size, new mtime
    second = fingerprint_folder(tmp_path / "m", cache=FingerprintCache(tmp_path / "cache.json"))
    assert second.digest != first.digest and second.first_difference(first) == "model.safetensors"
