"""One validation on every launch path (issue 15): `python -m flows.ppo`, a deployment's
flow run and `--validate-manifest` refuse the same configs with the same `key: message`
lines, and the CLI refuses before it starts Prefect or Ray (S-RUN-3)."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest

from configs.loading import ConfigError, load_config
from cli.manifest import check_manifest, validate_manifest
from rundir.preflight import config_problems, machine_problems, visible_gpus
from rundir.preflight_checks import require_runnable
from tests.conftest import REPO_ROOT, TINY_PROFILE

PUBLIC_PROFILE = str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py")
UNEVEN_ENGINES = ["rl.batch_size=10", "rl.minibatch_size=2", "rl.micro_batch_size=2", "grid.cpu_rollout_engines=4"]


def _keys(problems) -> list[str]:
    return [problem.key for problem in problems]


def test_a_batch_the_rollout_engines_cannot_split_is_refused_naming_both_keys():
    problems = config_problems(load_config(TINY_PROFILE, UNEVEN_ENGINES))
    assert _keys(problems) == ["rl.batch_size"]
    assert "grid.cpu_rollout_engines" in problems[0].message and "4 rollout engines" in problems[0].message


def test_an_engine_deadline_not_below_the_stage_timeout_is_refused():
    """S-ELASTIC-1: a hung engine must be found and replaced before its stage fails."""
    late = ["rl.stage_timeout_seconds=60", "rl.rollout.engine_timeout_seconds=60"]
    problems = config_problems(load_config(TINY_PROFILE, late))
    assert _keys(problems) == ["rl.rollout.engine_timeout_seconds"]
    assert "not below rl.stage_timeout_seconds=60" in problems[0].message
    assert config_problems(load_config(TINY_PROFILE, ["rl.stage_timeout_seconds=60"])) == []  # null: 15 s


def test_a_minibatch_that_does_not_divide_the_batch_is_refused_at_config():
    problems = config_problems(
        load_config(TINY_PROFILE, ["rl.batch_size=12", "rl.minibatch_size=8", "rl.micro_batch_size=8"])
    )
    assert _keys(problems) == ["rl.minibatch_size"] and "does not divide rl.batch_size 12" in problems[0].message


def test_a_token_budget_below_the_longest_response_is_refused_naming_both_numbers():
    """S-PATH-3: the tiny profile generates up to rl.rollout.max_new_tokens tokens; a
    micro-batch must hold one such response and its prompt."""
    budget = load_config(TINY_PROFILE, []).rl.rollout.max_new_tokens
    problems = config_problems(load_config(TINY_PROFILE, [f"rl.micro_batch_tokens={budget}"]))
    assert _keys(problems) == ["rl.micro_batch_tokens"]
    assert f"is {budget}, but one row can hold {budget} response tokens (rl.rollout.max_new_tokens)" in (
        problems[0].message
    )
    assert config_problems(load_config(TINY_PROFILE, [f"rl.micro_batch_tokens={budget + 1}"])) == []


def test_the_local_backend_does_nothing_and_is_refused():
    problems = config_problems(load_config(TINY_PROFILE, ["grid.backend=local"]))
    assert _keys(problems) == ["grid.backend"] and "its own Ray actor group" in problems[0].message


def test_a_gpu_placement_must_fit_the_machine_it_starts_on():
    config = load_config(PUBLIC_PROFILE)
    assert config_problems(config) == []  # the config itself is fine: it declares 4 GPUs
    (problem,) = machine_problems(config, environ={}, gpus=0)
    assert problem.key == "grid.gpus_per_node" and "needs 4 GPUs, but this machine has 0" in problem.message
    assert machine_problems(config, environ={}, gpus=4) == []
    assert machine_problems(config, environ={"RAY_ADDRESS": "10.0.0.1:6379"}, gpus=0) == []  # checked on the cluster
    assert machine_problems(load_config(TINY_PROFILE), environ={}, gpus=0) == []
    with pytest.raises(ConfigError, match="grid.gpus_per_node"):
        require_runnable(config, environ={"CUDA_VISIBLE_DEVICES": "0,1"})


def test_visible_gpus_follows_cuda_visible_devices_then_the_driver(tmp_path):
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,3"}) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    for index in range(3):
        (tmp_path / f"0000:0{index}:00.0").mkdir()
    assert visible_gpus({}, driver_dir=str(tmp_path)) == 3
    assert visible_gpus({}, driver_dir=str(tmp_path / "absent")) == 0


def test_the_manifest_reports_the_run_paths_lines_and_notes_the_machine():
    config = load_config(TINY_PROFILE, UNEVEN_ENGINES)
    assert [str(p) for p in check_manifest(config).problems][:1] == [str(p) for p in config_problems(config)]
    err = io.StringIO()
    assert validate_manifest(TINY_PROFILE, UNEVEN_ENGINES, out=io.StringIO(), err=err) == 1
    assert f"error: {config_problems(config)[0]}" in err.getvalue().splitlines()
    # A 4-GPU launch checked from a machine without GPUs: the plan is fine, the machine is noted.
    report = check_manifest(load_config(PUBLIC_PROFILE), environ={"CUDA_VISIBLE_DEVICES": ""})
    assert report.ok and any("a launch on this machine would be refused" in note for note in report.notes)


def _cli(*args: str, cwd) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "flows.ppo", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""},
    )
    return result, time.monotonic() - started


@pytest.mark.parametrize(
    ("profile", "overrides", "line"),
    [
        (
            TINY_PROFILE,
            UNEVEN_ENGINES,
            "error: rl.batch_size: is 10, not divisible by the 4 rollout engines (grid.cpu_rollout_engines); "
            "every engine generates an equal shard",
        ),
        (
            PUBLIC_PROFILE,
            [],
            "error: grid.gpus_per_node: is 4: the colocated placement needs 4 GPUs, but this machine has 0",
        ),
        # S-XFER-2
        (TINY_PROFILE, ["grid.grouping=single"], "error: grid.grouping: is 'single', but PPO runs the policy"),
        # S-SEC-3: the shell command never runs (the test's folder stays empty).
        (TINY_PROFILE, ["rl.data.factory=os:system", 'rl.data.factory_kwargs={"command": "touch marker.txt"}'],
         "error: rl.data.factory: 'os:system' names code in module 'os', which an override may not name"),
        # S-SEC-5
        (TINY_PROFILE, ["job.name=../../elsewhere"], "error: job.name: '../../elsewhere' must be one folder name"),
    ],
)
def test_the_cli_refuses_in_seconds_before_starting_anything_and_writes_nothing(profile, overrides, line, tmp_path):
    result, seconds = _cli(
        "--config", profile, "--", f"job.output_root={tmp_path / 'outputs'}", *overrides, cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0].startswith(line) and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stdout == ""  # not even the run's opening line: nothing started
    assert list(tmp_path.iterdir()) == []  # no run folder, no Prefect home, no model
    assert seconds < 30  # a config check and the imports it needs, not the 20 s+ of the embedded API


@pytest.mark.parametrize("key", ["rl.reward.terminal_callable", "rl.data.factory"])
def test_user_code_that_cannot_be_found_is_refused_before_any_worker(key):
    # A module the profile trusts (S-SEC-3), so the override reaches the find check.
    trusting = str(REPO_ROOT / "tests" / "support" / "profiles" / "tiny_trusting_tests.py")
    config = load_config(trusting, [f"{key}=tests.no_such_package.rewards:score"])
    problems = [p for p in config_problems(config) if p.key == key]
    assert len(problems) == 1 and "no module named 'tests.no_such_package'" in problems[0].message
    report = check_manifest(config)
    assert [str(p) for p in report.problems if p.key == key] == [str(problems[0])]  # reported once


def test_one_step_off_on_gpus_needs_the_engines_on_gpus_of_their_own():
    """S-ASYNC-1: generating beside training on the GPUs the policy trains on is refused
    before anything starts; on CPU, and disaggregated, it is allowed."""
    (problem,) = config_problems(load_config(PUBLIC_PROFILE, ["rl.rollout.max_staleness=1"]))
    assert problem.key == "rl.rollout.max_staleness" and "grid.gpu_placement=disaggregated" in problem.message
    disaggregated = ["grid.gpu_placement=disaggregated", "grid.policy_gpus=1", "grid.rollout_gpus=1"]
    assert config_problems(load_config(PUBLIC_PROFILE, ["rl.rollout.max_staleness=1", *disaggregated])) == []
    assert config_problems(load_config(TINY_PROFILE, ["rl.rollout.max_staleness=1"])) == []


def test_nixl_that_cannot_load_is_refused_before_anything_starts(monkeypatch):
    """S-XFER-1: a machine without a loadable NIXL is told so by the key, with the
    package each name gave; the object store needs nothing."""
    from weights import nixl_package

    monkeypatch.setattr(nixl_package, "MODULES", ("nixl_not_installed_here",))
    config = load_config(TINY_PROFILE, ["rl.weight_sync_transport=nixl"])
    (problem,) = machine_problems(config)
    assert problem.key == "rl.weight_sync_transport"
    assert "No module named 'nixl_not_installed_here'" in problem.message
    assert "pip install nixl-cu13 (CUDA 13) or nixl-cu12" in problem.message
    assert machine_problems(load_config(TINY_PROFILE, [])) == []
