"""SIGTERM at random moments (S-STOP-1): the command line, preempted three times during
a rollout, a train stage or a commit with rl.save_every far away, each time commits the
last finished iteration, exits 143 within the grace with a last line naming that
boundary, and the rerun ends with the uninterrupted run's weights and train/* metrics,
one row per iteration. The signal goes to the run's process, as Kubernetes sends it."""

from __future__ import annotations

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

ITERATIONS = 10
GRACE_S = 30.0


def _overrides(root: Path, model_dir: str) -> list[str]:
    return [
        f"job.output_root={root}", f"model.path={model_dir}", "rl.batch_size=16", "rl.minibatch_size=8",
        "rl.micro_batch_size=8", "rl.epochs=1", "rl.validation=null", f"rl.max_steps={ITERATIONS}",
        "rl.save_every=100", "rl.rollout.max_new_tokens=4", "job.name=preempted",
    ]


def test_sigterm_at_random_moments_commits_the_finished_iteration_and_the_rerun_is_exact(tiny_model_dir, tmp_path):
    from configs.loading import load_config
    from flows.in_process import run_in_process
    from rundir.run_outputs import RunPaths

    config = load_config(TINY_PROFILE, _overrides(tmp_path / "straight", tiny_model_dir))
    straight, _ = run_in_process(config, paths=RunPaths.for_config(config))

    root, rng = tmp_path / "outputs", random.Random(31)
    run_dir = root / "preempted"
    command = [sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--", *_overrides(root, tiny_model_dir)]
    for attempt in range(3):
        log = tmp_path / f"attempt{attempt}.log"
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
        start = metric_rows(run_dir)
        while metric_rows(run_dir) <= start and process.poll() is None:
            time.sleep(0.05)
        # A random moment of the next iteration, whatever this machine's speed: a fraction
        # of the iteration that just finished (a fixed second ran past several on a quiet one).
        time.sleep(rng.uniform(0.0, 1.0) * last_iteration_seconds(run_dir))
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert process.wait(timeout=GRACE_S + 30) == 143, log.read_text()[-3000:]
        assert time.monotonic() - signalled < GRACE_S
        done = metric_rows(run_dir)
        assert (boundary(run_dir, done) / "_SUCCESS").is_file(), log.read_text()[-3000:]
        last = log.read_text().strip().splitlines()[-1]
        assert last.startswith("stopped by SIGTERM after iteration") and f"iter_{done:06d}" in last, last
    assert metric_rows(run_dir) < ITERATIONS, "the signals came too late to interrupt anything"
    final = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]

    rows = metric_records(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, ITERATIONS + 1))
    for got, want in zip(rows, straight):
        assert {k: v for k, v in got.items() if k.startswith("train/")} == {
            k: v for k, v in want.items() if k.startswith("train/")
        }
    for role in ("policy", "critic"):
        assert weights_digest(boundary(run_dir, ITERATIONS) / role) == weights_digest(
            boundary(tmp_path / "straight" / "preempted", ITERATIONS) / role
        ), role
