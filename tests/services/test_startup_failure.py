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


def missing_tokenizer_packer(model_path: str):
    """The data_packer.factory this test points at: the rollout actor builds it in its
    constructor, so the run fails while its actors start."""
    raise FileNotFoundError(f"no tokenizer under {model_path}/broken")


@pytest.mark.slow
def test_the_cli_ends_a_start_up_failure_on_the_error_line_and_the_resume_hint(
    prefect_api, ray_cluster, tiny_overrides, tmp_path
):
    import os
    import subprocess
    import sys

    import ray
    from prefect.settings import PREFECT_API_URL

    from tests.conftest import REPO_ROOT, TRUSTING_TINY_PROFILE

    overrides = tiny_overrides + [
        "rl.max_steps=1", "job.name=broken-start",
        "data_packer.factory=tests.services.test_startup_failure:missing_tokenizer_packer",
    ]
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    result = subprocess.run(
        [sys.executable, "-m", "flows.ppo", "--config", TRUSTING_TINY_PROFILE, "--", *overrides],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    last_lines = result.stderr.strip().splitlines()[-2:]
    assert last_lines[0].startswith("error: rollout failed to start: FileNotFoundError: no tokenizer under "), (
        result.stderr[-3000:]
    )
    assert last_lines[1].strip() == "run it again to resume from the last committed boundary"
