"""`python -m tests.services.faulty_ppo ARGS`: the real command line (`python -m
flows.ppo ARGS`) with a fault injected from outside the production code, for the tests
that prove resume after a crash at every point of an iteration (S-FAULT-2).

`PPO_TEST_FAULT=kill:<iteration>:<point>` SIGKILLs the flow process when the run
reaches that point (no cleanup, no Python finally blocks), the way a preempted node
dies: after a stage's task (`STAGE_POINTS`) or inside a commit (`COMMIT_POINTS`).
"""

from __future__ import annotations

import functools
import os
import runpy
import signal

STAGE_POINTS = (
    "after_rollout", "after_reward", "after_reference_score", "after_critic_predict", "after_prepare_batch",
    "after_train", "after_weight_sync",
)
COMMIT_POINTS = ("before_marker", "after_marker", "after_commit")
"""Inside a commit: the role saves done, no `_SUCCESS` yet; `_SUCCESS` written, the
pointer not moved yet; the pointer moved, the iteration's metrics row not written yet."""
FAULT_POINTS = STAGE_POINTS + COMMIT_POINTS


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(spec: str) -> None:
    """Wrap the runner's stage calls and the commit's marker and pointer writes so the
    process dies at the named point of the named iteration."""
    import flows.flow_runner
    import tasks.commit

    action, at_iteration, at_point = spec.split(":")
    assert action == "kill" and at_point in FAULT_POINTS, spec
    at = int(at_iteration)
    runner = flows.flow_runner.FlowRunner

    def after_stage(method, name_of):
        @functools.wraps(method)
        def wrapped(self, first, iteration, *args, **kwargs):
            result = method(self, first, iteration, *args, **kwargs)
            if iteration == at and at_point == f"after_{name_of(first)}":
                _kill()
            return result
        return wrapped

    runner.stage = after_stage(runner.stage, lambda body: body.__name__)
    runner.concurrent_stages = after_stage(runner.concurrent_stages, lambda label: label)

    write_marker = tasks.commit.write_marker

    def marker(boundary, *, iteration, **kwargs):
        if iteration == at and at_point == "before_marker":
            _kill()
        write_marker(boundary, iteration=iteration, **kwargs)
        if iteration == at and at_point == "after_marker":
            _kill()

    tasks.commit.write_marker = marker  # `after_marker`: dead before the pointer moves


if __name__ == "__main__":
    from cli.environment import apply_default_environment
    from processes.ray_session import prepare_ray_auth

    apply_default_environment()  # as the command line does, before Prefect and Ray are imported
    prepare_ray_auth(joins_cluster=bool(os.environ.get("RAY_ADDRESS")))
    install(os.environ["PPO_TEST_FAULT"])
    runpy.run_module("flows.ppo", run_name="__main__", alter_sys=True)
