"""Faults a long run meets (issue 16, S-FAULT-1): an actor process that dies or hangs
mid-run ends the run within seconds in a named failure (`<stage>[iter=N] failed: ...`
naming the role), and a rerun resumes exactly (S-CKPT-8)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from flows.failures import StageFailed
from tests.conftest import TINY_PROFILE
from tests.support.helpers import alive, assert_ends_like_the_uninterrupted_run, signal_actor_after


FROZEN_TIMEOUT = 10


def test_a_frozen_actor_fails_its_stage_by_name_within_the_timeout_and_is_killed(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    from flows.training import ppo

    # 10 s: ten times a stage of this tiny run on a busy 2-core machine, and half the
    # suite's cost of the 20 s it was (issue 19).
    overrides = tiny_overrides + ["rl.max_steps=8", "job.name=frozen", f"rl.stage_timeout_seconds={FROZEN_TIMEOUT}"]
    freezer = signal_actor_after(tmp_path / "outputs" / "frozen", 1, "frozen", "reward", signal.SIGSTOP)
    try:
        with pytest.raises(StageFailed) as caught:
            ppo(profile=TINY_PROFILE, overrides=overrides)
        failed_after = time.monotonic() - freezer.hit_at
        message = str(caught.value)
        print(f"\nfrozen reward actor: failed {failed_after:.1f} s after SIGSTOP: {message[:120]}")
        assert message.startswith("reward[iter="), message
        assert (
            f"StageTimeout: no result from the reward actor within {FROZEN_TIMEOUT} s "
            f"(rl.stage_timeout_seconds={FROZEN_TIMEOUT})"
        ) in message
        assert FROZEN_TIMEOUT <= failed_after < FROZEN_TIMEOUT + 40, failed_after
        deadline = time.monotonic() + 30
        while alive(freezer.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(freezer.pid)  # the stuck actor was killed, not left holding its device
    finally:
        if freezer.pid and alive(freezer.pid):
            os.kill(freezer.pid, signal.SIGKILL)


# The critic in the default suite (the case); every other role under -m slow.
@pytest.mark.parametrize(
    "role",
    [
        "critic",
        *(
            pytest.param(r, marks=pytest.mark.slow)
            for r in ("data", "rollout", "reward", "replay", "reference", "policy")
        ),
    ],
)
def test_a_killed_actor_fails_the_run_by_role_and_a_rerun_ends_bitwise_equal(
    role, prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    from flows.training import ppo

    overrides = tiny_overrides + ["rl.max_steps=4", "rl.save_every=2", f"job.name=killed-{role}"]
    run_dir = tmp_path / "outputs" / f"killed-{role}"
    killer = signal_actor_after(run_dir, 2, f"killed-{role}", role, signal.SIGKILL)
    with pytest.raises(StageFailed) as caught:
        ppo(profile=TINY_PROFILE, overrides=overrides)
    failed_after = time.monotonic() - killer.hit_at
    print(f"\nkilled {role} actor: failed {failed_after:.1f} s after SIGKILL: {str(caught.value)[:160]}")
    assert re.match(
        rf"^\w+\[iter=[34]\] failed: Actor\w+Error: the {role} actor .*is gone", str(caught.value)
    ), str(caught.value)
    assert failed_after < 30, failed_after
    assert (run_dir / "checkpoints" / "latest_checkpoint.txt").read_text().strip() == "iter_000002"

    summary = ppo(profile=TINY_PROFILE, overrides=overrides)
    assert summary["resumed_from"].endswith("iter_000002")
    assert_ends_like_the_uninterrupted_run(run_dir, overrides, f"straight-{role}", 4)


def test_a_second_launch_of_a_live_run_is_refused_in_seconds_and_touches_nothing(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    import subprocess
    import sys

    from rundir.run_lock import RunLocked
    from flows.training import ppo
    from tests.conftest import REPO_ROOT

    run_dir = tmp_path / "outputs" / "busy"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from rundir.run_lock import RunLock; "
         "RunLock(sys.argv[1], 'first-run (abc)').acquire(); print('held', flush=True); time.sleep(120)", str(run_dir)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        overrides = tiny_overrides + ["rl.max_steps=2", "job.name=busy"]
        started = time.monotonic()
        with pytest.raises(RunLocked, match=rf"pid {holder.pid}, flow run first-run \(abc\)"):
            ppo(profile=TINY_PROFILE, overrides=overrides)
        assert time.monotonic() - started < 30
        assert sorted(p.name for p in run_dir.iterdir()) == ["RUN_LOCK"]  # nothing written beside the holder's lock

        cli = subprocess.run(
            [sys.executable, "-m", "flows.ppo", "--config", TINY_PROFILE, "--", *overrides],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        )
        assert cli.returncode == 2 and f"pid {holder.pid}" in cli.stderr.splitlines()[-1], cli.stderr[-2000:]
        assert cli.stdout == ""  # refused before the Prefect API or Ray started
    finally:
        holder.kill()
        holder.wait()
    # The holder died without releasing: the next launch takes its lock over and runs.
    summary = ppo(profile=TINY_PROFILE, overrides=overrides)
    assert summary["policy_version"] == 2 and not (run_dir / "RUN_LOCK").exists()


@pytest.mark.slow  # repeats tests/services/test_deployment.py's actor-death auto-resume, minus the server
def test_auto_resume_finishes_a_run_whose_actor_died_within_the_same_flow_run(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    """S-FAULT-5: the deployments' `auto_resume_attempts` (the public one sets 3)."""
    from flows.training import ppo

    overrides = tiny_overrides + ["rl.max_steps=4", "rl.save_every=2", "job.name=auto"]
    run_dir = tmp_path / "outputs" / "auto"
    signal_actor_after(run_dir, 2, "auto", "reference", signal.SIGKILL)
    summary = ppo(profile=TINY_PROFILE, overrides=overrides, auto_resume_attempts=1)
    assert summary["resumed_from"].endswith("iter_000002") and summary["policy_version"] == 4

    assert_ends_like_the_uninterrupted_run(run_dir, overrides, "auto-straight", 4)
