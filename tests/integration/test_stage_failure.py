"""A stage that raises inside its actor fails the run by name (issue 8): the flow's
error leads with `reward[iter=1]`, that task run is the Failed one in the Prefect API,
no later stage of the iteration ran, and nothing was committed."""

import time
import uuid

import pytest

from tests.conftest import TINY_PROFILE

pytestmark = [pytest.mark.ray, pytest.mark.prefect]


def exploding_rule(ctx) -> bool:
    """The terminal_callable this test points at: user reward code with a bug."""
    raise ZeroDivisionError("the user's reward rule divided by zero")


exploding_rule.needs_reference = False  # type: ignore[attr-defined]


def test_an_actor_error_fails_the_task_of_its_stage_and_names_stage_and_iteration(
    prefect_api, ray_cluster, tiny_overrides, tmp_path
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.ppo import StageFailed, ppo

    overrides = tiny_overrides + [
        "rl.max_steps=2",
        "rl.reward.terminal_callable=tests.integration.test_stage_failure:exploding_rule",
    ]
    state = ppo(profile=TINY_PROFILE, overrides=overrides, run_name="explodes", return_state=True)
    assert state.is_failed()
    with pytest.raises(StageFailed, match=r"^reward\[iter=1\] failed: ZeroDivisionError: the user's reward rule"):
        state.result()

    flow_run_id = state.state_details.flow_run_id
    filter_ = FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(str(flow_run_id))]))
    deadline = time.time() + 60
    with get_client(sync_client=True) as client:
        while True:  # task-run history is recorded asynchronously
            runs = {run.name: run for run in client.read_task_runs(flow_run_filter=filter_)}
            settled = "reward[iter=1]" in runs and runs["reward[iter=1]"].state.is_final()
            if settled or time.time() > deadline:
                break
            time.sleep(0.5)
    assert runs["rollout[iter=1]"].state.is_completed()
    assert runs["reward[iter=1]"].state.is_failed()
    assert not any(name.startswith(("reference_score", "train_", "weight_sync", "commit")) for name in runs), sorted(runs)
    assert not (tmp_path / "outputs" / "explodes" / "checkpoints" / "latest_checkpoint.txt").exists()
