"""One step off through the `ppo` flow (S-ASYNC-1, S-ASYNC-3): the flow over Ray actors
computes exactly what the in-process run computes, and the Prefect history shows each
next batch's rollout task started inside the previous iteration, beside its training."""

from __future__ import annotations

from flows.in_process import run_in_process
from flows.training import resolve_config
from rundir.run_outputs import RunPaths
from tests.conftest import TINY_PROFILE
from tests.support.helpers import metric_records, without_timings


def _task_runs(flow_run_name: str) -> dict[str, object]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.recording import run_flow_runs

    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name])))
        return {run.name: run for run in client.read_task_runs(flow_run_filter=run_flow_runs(flow_run.id), limit=200)}


def test_a_one_step_off_flow_equals_the_in_process_run_and_overlaps_in_the_ui(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    from flows.training import ppo

    overrides = tiny_overrides + [
        "rl.max_steps=4", "rl.save_every=2", "rl.rollout.max_staleness=1", "job.iterations_per_block=2",
    ]
    ppo(profile=TINY_PROFILE, overrides=overrides, run_name="one-step-off", critic_warmup_iterations=1)
    records = metric_records(tmp_path / "outputs" / "one-step-off")
    assert [r["rollout/staleness"] for r in records] == [0.0, 0.0, 1.0, 1.0]  # warmup publishes nothing (S-ASYNC-4)

    config = resolve_config(TINY_PROFILE, overrides + ["job.name=one-step-off-in-process"], 1, None)
    in_process, _ = run_in_process(config, paths=RunPaths.for_config(config))
    assert [without_timings(r) for r in records] == [without_timings(r) for r in in_process]

    runs = _task_runs("one-step-off")
    assert "rollout[iter=1]" in runs and len([name for name in runs if name.startswith("rollout[")]) == 4
    for iteration in (1, 2, 3):  # batch N+1 was generated while iteration N trained, in N's block
        ahead, trained = runs[f"rollout[iter={iteration + 1}]"], runs[f"train_critic[iter={iteration}]"]
        assert ahead.start_time < trained.end_time and ahead.flow_run_id == trained.flow_run_id, iteration
