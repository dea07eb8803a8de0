"""Set-up every test shares, and the three folders, named by what their tests start:

- tests/pure: nothing heavy (no Prefect API, no Ray, no model built, no role body);
- tests/in_process: the tiny model, role bodies, PPO iterations through
  `flows.in_process`, torch.distributed ranks spawned here; no Prefect API, no Ray;
- tests/services: a real Prefect API and/or a real local Ray (tests/services/conftest.py).

Each test gets its folder's marker (`pytest -m pure`), so a quick check can skip what
starts services without knowing file names.
"""

from __future__ import annotations

import os
import sys
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
# The tiny profile with tests/ trusted: overrides may name callables of tests/ (S-SEC-3).
TRUSTING_TINY_PROFILE = str(REPO_ROOT / "tests" / "support" / "profiles" / "tiny_trusting_tests.py")
TEST_FOLDERS = ("pure", "in_process", "services")
# A pure test builds no model: these fixtures belong to tests/in_process and tests/services.
MODEL_FIXTURES = {"tiny_model_dir", "tiny_overrides", "tiny_reward_model_dir"}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        folder = item.path.relative_to(REPO_ROOT / "tests").parts[0]
        if folder not in TEST_FOLDERS:
            raise pytest.UsageError(f"{item.nodeid}: test files live in tests/pure, tests/in_process or tests/services")
        if folder == "pure" and MODEL_FIXTURES & set(item.fixturenames):
            raise pytest.UsageError(f"{item.nodeid} builds the tiny model: it belongs in tests/in_process")
        item.add_marker(folder)



@pytest.fixture(autouse=True)
def _starts_no_ray(request):
    """Fails a pure or in-process test that started Ray (any Ray call outside a cluster
    starts one, without this project's settings, which later services tests would join)."""
    if request.node.get_closest_marker("services"):
        yield
        return
    ray = sys.modules.get("ray")
    running_before = ray is not None and ray.is_initialized()
    yield
    ray = sys.modules.get("ray")
    if not running_before and ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.node.nodeid} started Ray: it belongs in tests/services, or fake the Ray call")

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
def tiny_reward_model_dir(tmp_path_factory) -> str:
    """A small untrained one-label reward model with the tiny policy's tokenizer, built
    once for the session (seconds: no preference training)."""
    from configs.schema import TinyRewardModelSpec
    from models.tiny_reward_model import build_tiny_reward_model

    spec = TinyRewardModelSpec(hidden_size=16, intermediate_size=32, num_hidden_layers=1, train_steps=0)
    return str(build_tiny_reward_model(tmp_path_factory.mktemp("reward-models") / "tiny-reward", spec))


@pytest.fixture(scope="session")
def user_models(tmp_path_factory):
    """GPT-2 folders as users bring them (tests/support/user_models.py), built once."""
    from tests.support.user_models import build_user_models

    return build_user_models(tmp_path_factory.mktemp("user-models"))


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
