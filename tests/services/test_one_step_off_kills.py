"""A one-step-off run killed at random moments resumes exactly (S-ASYNC-3): the command
line is SIGKILLed four times, each time after the run has written one more metrics row
and a random fraction of that row's iteration later (in a rollout, a train stage, a
commit), and rerun; it ends with the weights and train/* metrics of the uninterrupted
run, one row per iteration, every boundary committed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, TINY_PROFILE
from tests.support.helpers import boundary, last_iteration_seconds, metric_records, metric_rows, weights_digest

pytestmark = pytest.mark.slow

# Each kill lands within the iteration after a launch's first new row, however fast the
# machine: four launches write at most 8 rows, so the last run has something to finish.
ITERATIONS = 16


def _overrides(root: Path, model_dir: str) -> list[str]:
    return [
        f"job.output_root={root}", f"model.path={model_dir}", "rl.batch_size=16", "rl.minibatch_size=8",
        "rl.micro_batch_size=8", "rl.epochs=1", "rl.validation=null", f"rl.max_steps={ITERATIONS}",
        "rl.save_every=1", "rl.rollout.max_staleness=1", "rl.rollout.max_new_tokens=4", "job.name=killed",
    ]


def _launch(root: Path, model_dir: str, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--", *_overrides(root, model_dir)]
    # Own session: the whole group (its temporary Prefect API, its local Ray) dies with it.
    return subprocess.Popen(command, cwd=REPO_ROOT, stdout=log.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill_after_one_more_row(process: subprocess.Popen, run_dir: Path, rng: random.Random) -> None:
    """The delay is a fraction of the iteration just timed, not seconds: a slow machine
    and a fast one are both caught inside the next iteration."""
    start = metric_rows(run_dir)
    deadline = time.monotonic() + 600
    while metric_rows(run_dir) <= start and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if metric_rows(run_dir) > start:
        time.sleep(rng.uniform(0.0, 1.0) * last_iteration_seconds(run_dir))
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)


def test_a_one_step_off_run_killed_four_times_ends_as_the_uninterrupted_run(tiny_model_dir, tmp_path):
    from configs.loading import load_config
    from flows.in_process import run_in_process
    from rundir.run_outputs import RunPaths

    config = load_config(TINY_PROFILE, _overrides(tmp_path / "straight", tiny_model_dir))
    straight, _ = run_in_process(config, paths=RunPaths.for_config(config))

    root, rng, log = tmp_path / "outputs", random.Random(29), tmp_path / "killed.log"
    run_dir = root / "killed"
    after_kills = []
    for _ in range(4):
        _kill_after_one_more_row(_launch(root, tiny_model_dir, log), run_dir, rng)
        after_kills.append(metric_rows(run_dir))
    print(f"\nmetrics rows after each kill: {after_kills}")
    assert metric_rows(run_dir) < ITERATIONS, "the kills came too late to interrupt anything"
    final = _launch(root, tiny_model_dir, log)
    assert final.wait(timeout=600) == 0, log.read_text()[-3000:]

    rows = metric_records(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, ITERATIONS + 1))
    for got, want in zip(rows, straight):
        assert {k: v for k, v in got.items() if k.startswith("train/")} == {
            k: v for k, v in want.items() if k.startswith("train/")
        }
    straight_dir = tmp_path / "straight" / "killed"
    for iteration in range(1, ITERATIONS + 1):
        assert (boundary(run_dir, iteration) / "_SUCCESS").is_file(), iteration
    for role in ("policy", "critic"):
        assert weights_digest(boundary(run_dir, ITERATIONS) / role) == weights_digest(
            boundary(straight_dir, ITERATIONS) / role
        ), role
