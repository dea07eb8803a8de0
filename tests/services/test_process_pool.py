"""Role processes kept from one run to the next (tests/support/process_pool.py, issue 19): the
next run's bodies are built afresh in them, so a kept process never carries one run's
state into the next, and a dead or hung process is never kept."""

import os
import signal

import pytest
import ray

from tests.conftest import TINY_PROFILE, short_run_overrides
from tests.support.helpers import without_timings


def _pid(handle) -> int:
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))


def _pids(handles) -> dict[str, int]:
    return {role: _pid(handle) for role, handle in handles.items()}


def _idle_pids(pool) -> dict[str, set[int]]:
    """The processes waiting in the pool, by role (earlier tests of the session may
    have left some there)."""
    return {role: {_pid(handle) for handle in handles} for role, handles in pool.idle.items()}


def test_a_kept_process_builds_the_next_run_afresh_and_a_dead_or_hung_one_is_not_kept(
    reused_role_processes, tiny_model_dir, tmp_path
):
    from configs.loading import load_config
    from flows.iteration import ppo_iteration
    from tests.support.actor_runner import ActorRunner
    from processes.actors import start_role_actors, stop_role_actors

    config = load_config(TINY_PROFILE, short_run_overrides(tmp_path, tiny_model_dir) + ["job.name=kept"])
    pool = reused_role_processes

    first = start_role_actors(config)
    first_pids = _pids(first)
    one = ppo_iteration(ActorRunner(), first, config, 1, 0)
    assert one.policy_version == 1
    stop_role_actors(first)
    idle = _idle_pids(pool)
    assert all(pid in idle[role] for role, pid in first_pids.items())

    reused_before = pool.reused
    second = start_role_actors(config)
    second_pids = _pids(second)
    assert second_pids == first_pids and pool.reused == reused_before + 7
    # Nothing of the first body is left: the policy never stepped, the engine holds version 0 ...
    assert ray.get(second.policy.update_counts.remote()) == {"optimizer_step": 0, "policy_version": 0}
    assert ray.get(second.rollout.ready.remote())["policy_version"] == 0
    # ... and the same iteration computes exactly what it computed in the first body.
    again = ppo_iteration(ActorRunner(), second, config, 1, 0)
    assert without_timings(again.record) == without_timings(one.record)

    # A run whose critic died and whose reward actor hangs: only the five others are kept.
    ray.kill(second.critic)
    os.kill(second_pids["reward"], signal.SIGSTOP)
    patience, pool.discard_timeout_s = pool.discard_timeout_s, 2.0
    try:
        stop_role_actors(second)
    finally:
        os.kill(second_pids["reward"], signal.SIGCONT)
        pool.discard_timeout_s = patience
    idle = _idle_pids(pool)
    kept = sorted(role for role, pid in second_pids.items() if pid in idle.get(role, set()))
    assert kept == ["data", "policy", "reference", "replay", "rollout"]
    for role in ("critic", "reward"):
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(getattr(second, role).ready.remote(), timeout=60)
