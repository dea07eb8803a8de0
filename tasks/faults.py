"""A test-only fault hook: kill the flow process at a named point.

`PPO_TEST_FAULT=kill:<iteration>:<point>` SIGKILLs this process when the loop
reaches that point (no cleanup, no Python finally blocks), the way a preempted node
dies. Tests use it to prove resume after a crash at every point of an iteration
(S-FAULT-2); it does nothing when unset.
"""

from __future__ import annotations

import os
import signal


STAGE_POINTS = (
    "after_rollout", "after_reward", "after_reference_score", "after_critic_predict", "after_prepare_batch",
    "after_train", "after_weight_sync",
)
"""After each stage's task of an iteration has completed (the runners call them)."""

COMMIT_POINTS = ("before_marker", "after_marker", "after_commit")
"""Inside a commit: the role saves done, no `_SUCCESS` yet; `_SUCCESS` written, the
pointer not moved yet; the pointer moved, the iteration's metrics row not written yet."""

FAULT_POINTS = STAGE_POINTS + COMMIT_POINTS


def fault_point(iteration: int, point: str) -> None:
    spec = os.environ.get("PPO_TEST_FAULT")
    if not spec:
        return
    action, at_iteration, at_point = spec.split(":")
    if action == "kill" and int(at_iteration) == iteration and at_point == point:
        os.kill(os.getpid(), signal.SIGKILL)
