"""An actor that fails at start-up (S-STOP-4, the start-up phase): the
run ends on `<role> failed to start: <the actor's own error>`, the line the command line
prints after `error: ` with the resume hint, as for a failed stage, and not Ray's
wrapper with the remote traceback."""

from __future__ import annotations

import time

import pytest


def test_an_actor_that_raises_in_its_constructor_is_named_with_its_own_error(ray_cluster):
    import ray

    from processes.actors import ActorStartupError, wait_until_ready

    @ray.remote(num_cpus=0)
    class Broken:
        def __init__(self) -> None:
            raise FileNotFoundError("no model at /models/missing")

        def ready(self) -> bool:
            return True

    broken = Broken.remote()
    try:
        with pytest.raises(ActorStartupError) as failed:
            wait_until_ready({"policy": [broken]}, timeout_s=60, launched_at=time.perf_counter())
    finally:
        ray.kill(broken)
    assert str(failed.value) == "policy failed to start: FileNotFoundError: no model at /models/missing"
