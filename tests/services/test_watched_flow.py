"""What a user watching a run reads (issue 18 items 2-4, S-OPS-2, S-OPS-3), from one
real `ppo` flow run over Ray actors with the CPU profile: `evaluate[iter=N]` task runs
in the Prefect history, `val/*` rows in metrics.jsonl equal to the in-process run's,
the TensorBoard event file, the experience files and the samples table.

The one flow-level test of these features; the in-process tests
(test_evaluation_in_process.py, test_experience_in_process.py,
test_trackers_in_process.py) hold the rest in seconds."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from views.history import artifact_key
from flows.in_process import run_in_process
from rundir.run_outputs import RunPaths
from flows.training import resolve_config
from tests.conftest import TINY_PROFILE
from tests.support.helpers import metric_records, without_timings

EVALUATION = [
    "rl.validation.data.factory=data.synthetic:each_digit", "rl.validation.every=2",
    "rl.validation.before_training=true",
]


def _task_run_names(flow_run_name: str, expected: set[str], timeout: float = 60.0) -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.recording import run_flow_runs

    deadline = time.time() + timeout
    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[flow_run_name])))
        while True:  # task-run history is recorded asynchronously
            runs = client.read_task_runs(flow_run_filter=run_flow_runs(flow_run.id))
            names = {run.name for run in runs}
            if expected <= names or time.time() > deadline:
                return names
            time.sleep(0.5)


def test_a_flow_run_evaluates_keeps_its_samples_and_writes_tensorboard(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from flows.training import ppo

    overrides = tiny_overrides + ["rl.max_steps=2", "rl.save_every=2", *EVALUATION]
    summary = ppo(profile=TINY_PROFILE, overrides=overrides, run_name="watched")
    run_dir = tmp_path / "outputs" / "watched"

    records = metric_records(run_dir)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert ["val/reward_mean" in r for r in records] == [True, False, True]
    # The flow evaluates exactly what the role bodies compute in process (S-CW-3's check, with evaluation on).
    config = resolve_config(TINY_PROFILE, overrides + ["job.name=watched-in-process"], None, None)
    in_process, _ = run_in_process(config, paths=RunPaths.for_config(config))
    assert [without_timings(r) for r in records] == [without_timings(r) for r in in_process]

    expected = {"evaluate[iter=0]", "evaluate[iter=2]", "prepare_batch[iter=1]", "prepare_batch[iter=2]"}
    names = _task_run_names("watched", expected)
    assert expected <= names and "evaluate[iter=1]" not in names, sorted(names)

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("val/reward_mean")] == [
        (0, pytest.approx(records[0]["val/reward_mean"])), (2, pytest.approx(records[2]["val/reward_mean"]))
    ]
    assert [e.step for e in events.Scalars("train/reward_mean")] == [1, 2]

    experience = sorted((run_dir / "experience").glob("iter_*.jsonl.gz"))
    assert [p.name for p in experience] == ["iter_000001.jsonl.gz", "iter_000002.jsonl.gz"]
    rows = [json.loads(line) for line in gzip.open(experience[-1], "rt")]
    assert len(rows) == 16 and {r["policy_version"] for r in rows} == {1}

    with get_client(sync_client=True) as client:  # one small table per iteration under the run's key
        tables = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key("watched", "samples")]))
        )
    assert sorted(t.description.split(":")[0] for t in tables) == ["iteration 1", "iteration 2"]
    assert all(len(json.loads(t.data)) == 4 and "of 16 samples" in t.description for t in tables)
    assert summary["policy_version"] == 2
