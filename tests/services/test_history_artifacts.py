"""Run history through a real Prefect API (`prefect_test_harness`): the iteration table,
progress and summary artifacts read back as the UI would show them, and a write the API
refuses never fails the run. What is built without an API: tests/pure/test_history.py."""

from __future__ import annotations

import json
import uuid

from rundir.run_outputs import append_metrics
from tests.support.metrics_rows import iteration_metrics
from views.history import RunHistory


def test_history_artifacts_read_back_through_the_prefect_api(prefect_api, tmp_path):
    from prefect import flow
    from prefect.artifacts import Artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    run_dir = tmp_path / "Probe_Run"
    run_dir.mkdir()
    metrics = str(run_dir / "metrics.jsonl")
    stale = iteration_metrics(2, 0.99, 0.9)  # written after the last boundary by a run that then crashed
    for record in (iteration_metrics(1, 0.1, 0.0, warmup=True, version=0), stale):
        append_metrics(metrics, record)

    @flow(name="history-probe", persist_result=False)
    def probe() -> RunHistory:
        from rundir.run_outputs import read_metrics

        history = RunHistory.start("Probe_Run", max_steps=3, earlier_records=read_metrics(metrics), start_iteration=2)
        assert [row["iteration"] for row in history.rows] == [1]
        for record in (iteration_metrics(2, 0.25, 0.01), iteration_metrics(3, 0.5, 0.02)):
            append_metrics(metrics, record)
            history.add_iteration(record)
        history.finish(
            {
                "run_name": "Probe_Run",
                "run_dir": str(run_dir),
                "iterations": 3,
                "policy_version": 2,
                "last_boundary": f"{run_dir}/checkpoints/iter_000003",
                "final_model": {"policy": f"{run_dir}/final_model/policy"},
                "first_reward_mean": 0.1,
                "last_reward_mean": 0.5,
                "reward_window": 3,
            }
        )
        return history

    state = probe(return_state=True)
    history = state.result()
    flow_run_id = state.state_details.flow_run_id

    with get_client(sync_client=True) as client:
        tables = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[history.table_key])))
    # Created once and updated in place: one artifact, not one copy of the table per iteration.
    assert len(tables) == 1 and tables[0].flow_run_id == flow_run_id
    latest = Artifact.get(history.table_key)  # what the UI's Artifacts page shows
    rows = json.loads(latest.data)
    assert [row["iteration"] for row in rows] == [1, 2, 3]
    assert [row["reward_mean"] for row in rows] == [0.1, 0.25, 0.5]  # the stale 0.99 was redone
    assert rows[0]["actor_warmup"] is True and rows[0]["policy_loss"] is None and rows[2]["policy_version"] == 3

    progress = Artifact.get(history.progress_key)
    assert progress.data == 100.0 and "iteration 3 of 3" in progress.description

    summary = Artifact.get(history.summary_key)
    assert summary.type == "markdown" and summary.flow_run_id == flow_run_id
    assert "| iterations done | 3 / 3 |" in summary.data
    assert f"`{run_dir}/checkpoints/iter_000003`" in summary.data
    assert f"{run_dir}/reward_curve.png" in summary.data and "data:image/png;base64," in summary.data
    assert (run_dir / "reward_curve.png").stat().st_size > 1000


def test_history_never_fails_the_run_when_the_api_refuses_a_write(prefect_api):
    from views.artifact_writes import artifact_writes

    history = RunHistory(run_name="gone", max_steps=2, table_id=uuid.uuid4(), progress_id=uuid.uuid4())
    history.add_iteration(iteration_metrics(1, 0.1, 0.0))  # both updates target artifacts that do not exist
    assert artifact_writes().flush(timeout_s=60)  # the refused writes were sent and came back refused
    assert [row["iteration"] for row in history.rows] == [1]
