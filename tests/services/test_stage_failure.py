"""A stage that raises inside its actor fails the run by name (issue 8, issue 15):
the documented command `python -m flows.ppo` ends on `error: reward[iter=1] failed:
...` and exits 1; that task run is the Failed one in the Prefect API, no later stage
of the iteration ran, and nothing was committed. The raising code here is the user's
reward, which a rerun would call again: the last line says to fix it, not to resume
(S-BYO-3; a fault a rerun gets past keeps the resume hint, tests/services/test_faults.py)."""

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import TRUSTING_TINY_PROFILE


def exploding_rule(ctx) -> bool:
    """The terminal_callable this test points at: user reward code with a bug."""
    raise ZeroDivisionError("the user's reward rule divided by zero")


exploding_rule.needs_reference = False  # type: ignore[attr-defined]


def test_the_cli_ends_on_the_failed_stage_and_what_to_fix(prefect_api, ray_cluster, tiny_overrides, tmp_path):
    import ray
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL

    from flows.recording import run_flow_runs

    from tests.conftest import REPO_ROOT

    overrides = tiny_overrides + [
        "rl.max_steps=2",
        "job.name=explodes",
        "rl.reward.terminal_callable=tests.services.test_stage_failure:exploding_rule",
    ]
    # The real command in its own process; it joins this session's Prefect API and Ray
    # cluster instead of starting its own (half a minute saved, nothing else changed).
    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        # Logs go out only when drained: the last ones reach the API only if the command drains them.
        "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "60",
    }
    result = subprocess.run(
        [sys.executable, "-m", "flows.ppo", "--config", TRUSTING_TINY_PROFILE, "--", *overrides],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    last_lines = result.stderr.strip().splitlines()[-2:]
    assert last_lines[0].startswith(
        "error: reward[iter=1] failed: RewardCallableFailed: reward 'tests.services.test_stage_failure:exploding_rule' "
        "raised ZeroDivisionError: the user's reward rule divided by zero on row "
    ), result.stderr[-3000:]
    assert last_lines[1].strip() == "a rerun would fail the same way: fix what the line above names first"

    deadline = time.time() + 60
    with get_client(sync_client=True) as client:
        flow_runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["explodes"])))
        assert len(flow_runs) == 1 and flow_runs[0].state.is_failed()
        while True:  # task-run history is recorded asynchronously
            runs = {
                run.name: run
                for run in client.read_task_runs(flow_run_filter=run_flow_runs(flow_runs[0].id))
            }
            settled = "reward[iter=1]" in runs and runs["reward[iter=1]"].state.is_final()
            if settled or time.time() > deadline:
                break
            time.sleep(0.5)
        # The run's last log line reached the standing API before the command exited
        # (nothing of the command is left to send it now).
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_runs[0].id])))
        assert any(log.message.startswith("Finished in state Failed") for log in logs), [
            log.message[:80] for log in logs][-5:]
    assert runs["rollout[iter=1]"].state.is_completed()
    assert runs["reward[iter=1]"].state.is_failed()
    assert not any(
        name.startswith(("reference_score", "train_", "weight_sync", "commit")) for name in runs
    ), sorted(runs)
    assert not (tmp_path / "outputs" / "explodes" / "checkpoints" / "latest_checkpoint.txt").exists()


def test_the_in_process_runner_names_the_failed_stage_the_same_way(tiny_overrides):
    from configs.loading import load_config
    from flows.failures import StageFailed
    from flows.in_process import run_in_process

    config = load_config(TRUSTING_TINY_PROFILE, tiny_overrides + [
        "rl.max_steps=1", "rl.reward.terminal_callable=tests.services.test_stage_failure:exploding_rule",
    ])
    named = (r"^reward\[iter=1\] failed: RewardCallableFailed: reward '\S+:exploding_rule' raised "
             r"ZeroDivisionError: the user's reward rule divided by zero on row \d+")
    with pytest.raises(StageFailed, match=named) as failed:
        run_in_process(config)
    assert failed.value.repeats
