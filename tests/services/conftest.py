"""What the services tests start: the session's Prefect API and local Ray, each started
at most once and only when a test asks for it (Prefect's API takes 19-25 s to start on
these machines, Ray about 10 s); runs that several tests read; and the role processes
that runs of this session share. Starting a run's seven actors is most of what such a
test costs (issue 19): a run several tests read is made once per session, and a test
whose runs end can ask for `reused_role_processes`, so its runs build their role bodies
in processes an earlier run of this session finished with (tests/support/process_pool.py).

A fault test finds the run's actor to kill or freeze through
`tests.support.helpers.run_actor`, which knows the kept process serving a role.
Tests that need a fresh process for what they check (a cleanup by Ray name, start-up
itself) or that run the command line in a subprocess keep fresh, named actors: they
do not ask for the fixture."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import TINY_PROFILE, short_run_overrides


# The proof by repetition that stops hold every time (S-STOP-2, S-STOP-5): each test
# taking `stop_attempt` runs every case this many times, back to back, e.g.
# `PPO_STOP_REPEATS=20 pytest -m slow tests/services/test_group_stop.py`.
STOP_REPEATS = int(os.environ.get("PPO_STOP_REPEATS", "1"))


def pytest_generate_tests(metafunc):
    if "stop_attempt" in metafunc.fixturenames and STOP_REPEATS > 1:
        metafunc.parametrize("stop_attempt", range(1, STOP_REPEATS + 1), ids=lambda n: f"try{n}")


@pytest.fixture
def stop_attempt() -> int:
    """Which repetition of a stop test this is (1 unless PPO_STOP_REPEATS is set)."""
    return 1


@pytest.fixture(scope="session")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def ray_cluster():
    from processes.ray_session import init_ray

    session = init_ray(num_cpus=2)
    yield session
    session.close()


@dataclass(frozen=True)
class FinishedRun:
    run_dir: Path
    overrides: list[str]
    summary: dict


@pytest.fixture(scope="session")
def role_process_pool(ray_cluster):
    """The session's idle role processes; killed when the session ends."""
    from tests.support.process_pool import RoleProcessPool

    pool = RoleProcessPool()
    yield pool
    pool.close()


@pytest.fixture
def reused_role_processes(role_process_pool):
    """Runs of this test take role processes from the session's pool and give the
    live ones back when they end (a dead or hung one is killed)."""
    from tests.support.process_pool import keep_role_processes

    with keep_role_processes(role_process_pool) as pool:
        yield pool


@pytest.fixture(scope="session")
def golden_run(prefect_api, ray_cluster, role_process_pool, tiny_model_dir, tmp_path_factory) -> FinishedRun:
    """Three iterations through the `ppo` flow (real Prefect, real Ray actors), no
    warmup, committing at iteration 2 (the cadence) and 3 (the end), in two block
    subflows (`iterations 1-2`, `iteration 3`). Tests only read it; none may write
    into its directory."""
    from flows.training import ppo
    from tests.support.process_pool import keep_role_processes

    root = tmp_path_factory.mktemp("golden")
    overrides = short_run_overrides(root, tiny_model_dir) + [
        "rl.max_steps=3", "rl.save_every=2", "job.name=golden",
        "job.iterations_per_block=2",
        # The weights reach the engine in many buckets (S-SCALE-3), read over NIXL from the
        # policy's process (S-XFER-1); tests/in_process/test_nixl_transport.py shows a
        # NIXL run equal to an object-store run.
        "rl.rollout.weight_sync_bucket_mib=0.05",
        "grid.gpu_placement=disaggregated", "rl.weight_sync_transport=nixl",
    ]
    with keep_role_processes(role_process_pool):
        summary = ppo(profile=TINY_PROFILE, overrides=overrides, critic_warmup_iterations=0)
    return FinishedRun(root / "golden", overrides, summary)
