"""Shared test set-up: real Prefect and real Ray, started once per test session.

Prefect's API start-up takes 19-25 s on these machines and Ray's about 10 s, so each
is started at most once (and only when a test asks for it), never per test.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_PREFECT_HOME = tempfile.mkdtemp(prefix="ppo-tests-prefect-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cli.environment import apply_default_environment  # noqa: E402  (before Prefect is imported)

apply_default_environment()  # the same Prefect/Ray settings as `make run`

from processes.ray_session import prepare_ray_auth  # noqa: E402

prepare_ray_auth(joins_cluster=False)  # the session's local Ray: before any test module imports Ray

# Property tests (issue 16 item 8) are derandomized so CI sees the same examples on
# every run; HYPOTHESIS_PROFILE=explore searches with fresh random examples.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY_PROFILE = str(REPO_ROOT / "configs" / "ppo_tiny_cpu.py")


def first_rank(config, role: str):
    """Rank 0's placement of a device role, as the actor starter would hand it, for
    tests that construct one role body in-process."""
    from placement.plan import plan_placement
    from placement.role_placement import role_placements

    return role_placements(plan_placement(config))[role][0]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The CPU profile's tiny model, built once for the whole session."""
    from configs.loading import load_profile
    from models.model_io import ensure_model

    model = load_profile(TINY_PROFILE).model
    path = tmp_path_factory.mktemp("models") / "tiny-qwen3-digits"
    return ensure_model(model.model_copy(update={"path": str(path)}))


@pytest.fixture(scope="session")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def ray_cluster():

    from processes.ray_session import init_ray, shutdown_ray

    init_ray(num_cpus=2)
    yield
    shutdown_ray()


def short_run_overrides(output_root, model_dir: str) -> list[str]:
    """Overrides that point a short CPU-profile run at `output_root` and the shared model."""
    return [
        f"job.output_root={output_root}",
        f"model.path={model_dir}",
        "rl.batch_size=16",
        "rl.minibatch_size=8",
        "rl.micro_batch_size=8",
        "rl.epochs=1",
        # Evaluation (S-OPS-2) writes an extra iteration-0 row; tests of it turn it on
        # (tests/in_process/test_evaluation_in_process.py).
        "rl.validation=null",
    ]


@pytest.fixture
def tiny_overrides(tmp_path, tiny_model_dir) -> list[str]:
    return short_run_overrides(tmp_path / "outputs", tiny_model_dir)
