"""Faults a long run meets (issue 16, S-FAULT-1): an actor process that dies or hangs
mid-run ends the run within seconds in a named failure (`<stage>[iter=N] failed: ...`
naming the role), and a rerun resumes exactly (S-CKPT-8)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from flows.failures import StageFailed
from tests.conftest import TINY_PROFILE
from tests.integration.helpers import signal_actor_after

pytestmark = [pytest.mark.ray, pytest.mark.prefect]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited too
        return stat.read().split()[2] != "Z"


def test_a_frozen_actor_fails_its_stage_by_name_within_the_timeout_and_is_killed(
    prefect_api, ray_cluster, tiny_overrides, tmp_path
):
    from flows.training import ppo

    overrides = tiny_overrides + ["rl.max_steps=8", "job.name=frozen", "rl.stage_timeout_seconds=20"]
    freezer = signal_actor_after(tmp_path / "outputs" / "frozen", 1, "frozen", "reward", signal.SIGSTOP)
    try:
        with pytest.raises(StageFailed) as caught:
            ppo(profile=TINY_PROFILE, overrides=overrides)
        failed_after = time.monotonic() - freezer.hit_at
        message = str(caught.value)
        assert message.startswith("reward[iter="), message
        assert "StageTimeout: no result from the reward actor within 20 s (rl.stage_timeout_seconds=20)" in message
        assert 20 <= failed_after < 60, failed_after
        deadline = time.monotonic() + 30
        while _alive(freezer.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(freezer.pid)  # the stuck actor was killed, not left holding its device
    finally:
        if freezer.pid and _alive(freezer.pid):
            os.kill(freezer.pid, signal.SIGKILL)
