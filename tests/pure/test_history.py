"""Run history in the Prefect UI: artifact keys, the iteration table, the progress and
summary artifacts, and the reward/KL curve (issue 8). The artifact tests go through a
real Prefect API (`prefect_test_harness`) and read back what the UI would show."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from views.curves import curve_points, write_reward_curve
from views.history import RunHistory, artifact_key, iteration_row, summary_markdown, table_rows
from rundir.run_outputs import append_metrics


def _record(iteration: int, reward: float, kl: float, warmup: bool = False, version: int | None = None) -> dict:
    record = {
        "iteration": iteration,
        "train/reward_mean": reward,
        "train/kl": kl,
        "train/value_loss": 0.05,
        "train/actor_warmup": 1.0 if warmup else 0.0,
        "train/policy_version": float(iteration if version is None else version),
        "time/data_seconds": 0.01,
        "time/rollout_seconds": 0.123456,
        "time/train_seconds": 0.5,
        "time/iteration_seconds": 0.9,
    }
    if not warmup:
        record["train/policy_loss"] = -0.0347
        record["time/weight_sync_seconds"] = 0.02
    return record


def test_artifact_keys_use_only_the_alphabet_prefect_accepts_and_keep_distinct_runs_apart():
    assert artifact_key("tiny-cpu", "iterations") == "ppo-tiny-cpu-iterations"
    odd = artifact_key("My_Run 1.5", "summary")
    assert re.fullmatch(r"[a-z0-9-]+", odd), odd
    assert odd.startswith("ppo-my-run-1-5-") and odd.endswith("-summary")
    # "My_Run" and "my-run" sanitise to the same slug; the hash keeps their histories apart.
    assert artifact_key("My_Run", "iterations") != artifact_key("my-run", "iterations")
    assert re.fullmatch(r"[a-z0-9-]+", artifact_key("___", "progress"))


def test_iteration_row_names_columns_in_stage_order_and_leaves_missing_metrics_empty():
    row = iteration_row(_record(1, 0.0625, 0.0, warmup=True, version=0))
    assert row == {
        "iteration": 1,
        "reward_mean": 0.0625,
        "kl": 0.0,
        "policy_loss": None,  # no actor update during critic warmup: empty, not 0
        "value_loss": 0.05,
        "policy_version": 0,
        "actor_warmup": True,
        "data_s": 0.01,
        "rollout_s": 0.1235,  # 0.123456 to 4 significant digits
        "train_s": 0.5,
        "iteration_s": 0.9,
    }
    # A later iteration with weight_sync: every row gets every column.
    rows = table_rows([row, iteration_row(_record(2, 0.1, 0.001))])
    assert list(rows[0]) == list(rows[1]) and rows[0]["weight_sync_s"] is None and rows[1]["weight_sync_s"] == 0.02


def test_reward_curve_is_a_png_drawn_from_the_latest_line_of_each_iteration(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    # Iteration 2 ran twice (a crash after it, then a resume from boundary 1): the later line counts.
    for record in (
        _record(1, 0.1, 0.0, warmup=True),
        _record(2, 0.9, 0.5),
        _record(2, 0.2, 0.01),
        _record(3, 0.3, 0.02),
    ):
        append_metrics(str(metrics), record)
    points = curve_points([json.loads(line) for line in metrics.read_text().splitlines()])
    assert points.iterations == [1, 2, 3] and points.reward_mean == [0.1, 0.2, 0.3]
    assert points.actor_warmup == [True, False, False]

    out = write_reward_curve(str(metrics), str(tmp_path / "reward_curve.png"), "probe")
    assert out == str(tmp_path / "reward_curve.png")
    from matplotlib.image import imread

    image = imread(out)
    assert image.shape[:2] == (500, 800)  # figsize (8, 5) at 100 dpi
    assert write_reward_curve(str(tmp_path / "missing.jsonl"), str(tmp_path / "none.png")) is None
    assert not (tmp_path / "none.png").exists()


def test_summary_markdown_names_iterations_boundary_reward_model_and_curve():
    records = [_record(1, 0.1, 0.0), _record(2, 0.75, 0.0123)]
    summary = {
        "run_name": "probe",
        "run_dir": "/runs/probe",
        "iterations": 2,
        "policy_version": 2,
        "last_boundary": "/runs/probe/checkpoints/iter_000002",
        "final_model": {"policy": "/runs/probe/final_model/policy"},
        "first_reward_mean": 0.1,
        "last_reward_mean": 0.75,
        "reward_window": 2,
    }
    text = summary_markdown(summary, records, "/runs/probe/reward_curve.png", b"\x89PNG fake")
    assert "| iterations done | 2 / 2 |" in text
    assert "`/runs/probe/checkpoints/iter_000002`" in text
    assert "| final reward mean (iteration 2) | 0.7500 |" in text
    assert "| exported policy model | `/runs/probe/final_model/policy` |" in text
    assert "[/runs/probe/reward_curve.png](file:///runs/probe/reward_curve.png)" in text
    assert "data:image/png;base64," in text


@pytest.mark.prefect
def test_history_artifacts_read_back_through_the_prefect_api(prefect_api, tmp_path):
    from prefect import flow
    from prefect.artifacts import Artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    run_dir = tmp_path / "Probe_Run"
    run_dir.mkdir()
    metrics = str(run_dir / "metrics.jsonl")
    stale = _record(2, 0.99, 0.9)  # written after the last boundary by a run that then crashed
    for record in (_record(1, 0.1, 0.0, warmup=True, version=0), stale):
        append_metrics(metrics, record)

    @flow(name="history-probe", persist_result=False)
    def probe() -> RunHistory:
        from rundir.run_outputs import read_metrics

        history = RunHistory.start("Probe_Run", max_steps=3, earlier_records=read_metrics(metrics), start_iteration=2)
        assert [row["iteration"] for row in history.rows] == [1]
        for record in (_record(2, 0.25, 0.01), _record(3, 0.5, 0.02)):
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


@pytest.mark.prefect
def test_history_never_fails_the_run_when_the_api_refuses_a_write(prefect_api):
    from views.artifact_writes import artifact_writes

    history = RunHistory(run_name="gone", max_steps=2, table_id=uuid.uuid4(), progress_id=uuid.uuid4())
    history.add_iteration(_record(1, 0.1, 0.0))  # both updates target artifacts that do not exist
    assert artifact_writes().flush(timeout_s=60)  # the refused writes were sent and came back refused
    assert [row["iteration"] for row in history.rows] == [1]


def test_an_iteration_sends_the_same_few_rows_at_iteration_300_as_at_iteration_3(monkeypatch):
    """S-OPS-1: the run's table is a window of the newest TABLE_WINDOW rows, so an
    update never grows with the run (before, every update re-sent every row)."""
    from views.history import TABLE_WINDOW

    sent: list[int] = []
    monkeypatch.setattr(RunHistory, "_update", lambda self, what, artifact_id, update: sent.append(
        len(json.loads(update.data))
    ))
    monkeypatch.setattr("views.history.update_progress_artifact", lambda *args, **kwargs: None)
    from views.artifact_writes import artifact_writes

    history = RunHistory(run_name="long", max_steps=300, table_id=uuid.uuid4(), progress_id=uuid.uuid4())
    for iteration in range(1, 301):
        history.add_iteration(_record(iteration, 0.1, 0.0))
        artifact_writes().flush()  # each update sent before the next (unsent ones would coalesce)
    assert sent[:3] == [1, 2, 3] and max(sent) == TABLE_WINDOW == sent[-1]
    assert [row["iteration"] for row in history.rows] == list(range(301 - TABLE_WINDOW, 301))
