"""A user's own GPT-2, data and reward, run end to end from the command line with
PYTHONPATH unset (issue 46, S-BYO-1, S-BYO-3): the plain-text packer feeds the
template-less model, every actor imports the reward module beside the profile, a
finished run relaunched does nothing in seconds, and a reward that raises ends on what
to fix, never on the resume hint. Each run starts its own Prefect API and Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO_ROOT
from tests.support.user_project import write_user_project

SHORT = ["rl.max_steps=1", "rl.batch_size=8", "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1"]
RAISES_ON_ODD = '''
def score(ctx):
    if int(ctx.reference) % 2:
        raise KeyError(f"no rule for {ctx.reference}")
    return ctx.completion.strip() == ctx.reference
'''
ALWAYS_SCORES = "def score(ctx):\n    return ctx.completion.strip() == ctx.reference\n"


def _launch(profile, *overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "RAY_ADDRESS")}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "flows.ppo", "--config", str(profile), "--", *SHORT, *overrides],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400,
    )
    return result, time.monotonic() - started


def _first_launch(tmp_path, user_models, module: str, reward_source: str):
    """The user's project beside the GPT-2 with `reward_source` as `module`, launched once."""
    profile = write_user_project(tmp_path / "mine", user_models.plain, module=module, reward_source=reward_source)
    return profile, _launch(profile)


@pytest.mark.slow
def test_a_users_gpt2_run_finishes_and_a_relaunch_does_nothing(tmp_path, user_models):
    profile, (result, _) = _first_launch(tmp_path, user_models, "own_run_rewards", ALWAYS_SCORES)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "packer: plain text (the tokenizer has no chat template" in result.stdout
    assert "done: run my-run at policy_version 1" in result.stdout
    again, seconds = _launch(profile)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1].startswith("done: run 'my-run' is complete: iteration 1 of 1")
    assert "ray:" not in again.stdout and "ppo: run" not in again.stdout  # nothing started
    assert seconds < 30  # the imports and the check; the first launch took Ray and seven actors


@pytest.mark.slow
def test_a_reward_that_raises_ends_on_the_row_and_the_fix_without_the_resume_hint(tmp_path, user_models):
    _, (result, _) = _first_launch(tmp_path, user_models, "own_run_raising", RAISES_ON_ODD)
    assert result.returncode == 1, result.stderr[-3000:]
    error, hint = result.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: reward[iter=1] failed: RewardCallableFailed: reward 'own_run_raising:score' "
                            "raised KeyError: 'no rule for "), result.stderr[-3000:]
    assert " on row " in error and "questions.jsonl row " in error and ", completion " in error
    assert hint.strip() == "a rerun would fail the same way: fix what the line above names first"
    assert "resume" not in result.stderr.strip().splitlines()[-1]
