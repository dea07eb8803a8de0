"""A test-only fault hook: kill the flow process at a named point.

`PPO_TEST_FAULT=kill:<iteration>:<point>` SIGKILLs this process when the loop
reaches that point (no cleanup, no Python finally blocks), the way a preempted node
dies. Tests use it to prove resume after a crash; it does nothing when unset.
"""

from __future__ import annotations

import os
import signal


def fault_point(iteration: int, point: str) -> None:
    spec = os.environ.get("PPO_TEST_FAULT")
    if not spec:
        return
    action, at_iteration, at_point = spec.split(":")
    if action == "kill" and int(at_iteration) == iteration and at_point == point:
        os.kill(os.getpid(), signal.SIGKILL)
