"""The walking skeleton, end to end: the `ppo` flow with real Prefect (embedded test
API), real local Ray actors and the tiny HF model."""

import json
import re
from pathlib import Path




def test_a_recorded_block_keeps_each_completed_task_run_with_its_final_state_only(golden_run):
    """S-FOOT-1 (job.task_history=compact, the default): once a block's task runs are
    recorded, its completed task runs keep their Completed state, start and end time;
    the Pending and Running states before it are gone from Prefect's database, so the
    UI's list of task runs reads the same with a third of the state rows. The parent
    flow run's own task runs (blocks, export) are not compacted."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["golden"])))
        blocks = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id]))
        )
        assert len(blocks) == 2
        for block in blocks:
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [block.id]}))
            assert tasks
            for task in tasks:
                states = client.read_task_run_states(task.id)
                assert [state.name for state in states] == ["Completed"], (block.name, task.name, states)
                assert task.start_time is not None and task.end_time is not None and task.end_time >= task.start_time
                assert task.total_run_time.total_seconds() > 0
        (export,) = [t for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [run.id]}))
                     if t.name.startswith("export")]
        assert [state.name for state in client.read_task_run_states(export.id)] == ["Pending", "Running", "Completed"]


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_iterations_write_metrics_commit_boundaries_and_advance_policy_version(golden_run):
    summary, run_dir = golden_run.summary, golden_run.run_dir
    records = _records(run_dir)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    for record in records:
        for key in ("train/reward_mean", "train/policy_loss", "train/value_loss", "train/kl",
                    "train/policy_clip_fraction", "train/policy_approx_kl", "train/explained_variance",
                    "time/rollout_seconds", "time/train_seconds"):
            assert key in record, key
    # The rollout sampled iteration k+1 with the weights published after iteration k.
    assert [r["rollout/policy_version"] for r in records] == [0.0, 1.0, 2.0]
    assert records[1]["train/policy_version"] == 2.0 and summary["policy_version"] == 3

    checkpoints = run_dir / "checkpoints"
    # Iteration 2 commits on the cadence (rl.save_every=2), iteration 3 because the run ends there.
    assert (checkpoints / "latest_checkpoint.txt").read_text().strip() == "iter_000003"
    marker = json.loads((checkpoints / "iter_000002" / "_SUCCESS").read_text())
    assert marker["iteration"] == 2 and marker["role_steps"] == {"policy": 4, "critic": 4}
    boundary = checkpoints / "iter_000003"
    for role_file in (
        "policy/model.safetensors",
        "policy/optimizer.pt",
        "critic/model.safetensors",
        "data/cursor.json",
    ):
        assert (boundary / role_file).is_file(), role_file


def test_the_run_graph_holds_one_node_per_block_and_each_block_its_iterations_tasks(golden_run):
    """S-OPS-1: with job.iterations_per_block=2 the `ppo` flow run's graph is two
    block subflow runs and the export; every stage task run is in its block, named
    `<stage>[iter=N]`, recorded and completed; the run's artifacts are on the `ppo`
    flow run and each block has its own iteration table."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey, FlowRunFilter, FlowRunFilterName,
        FlowRunFilterParentFlowRunId,
    )

    from views.history import artifact_key
    from flows.recording import count_task_runs, run_flow_runs
    from contracts.stage_names import ITERATION_TASKS

    stages = [stage for stage in ITERATION_TASKS if stage not in ("evaluate", "commit")]
    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["golden"])))
        blocks = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id]))
        )
        assert sorted(block.name for block in blocks) == ["iteration 3", "iterations 1-2"]
        assert all(block.state.is_completed() for block in blocks)
        own = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [run.id]}))
        # The parent graph: the two blocks (each a subflow's task run) and the export.
        assert sorted(re.sub(r"-\d+$", "", task.name) for task in own) == [
            "export[iter=3]", "ppo-iterations", "ppo-iterations"
        ], [task.name for task in own]
        by_name = {block.name: block for block in blocks}
        for name, iterations in (("iterations 1-2", (1, 2)), ("iteration 3", (3,))):
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [by_name[name].id]}))
            expected = {f"{stage}[iter={i}]" for i in iterations for stage in stages}
            expected |= {f"commit[iter={i}]" for i in iterations if i in (2, 3)}
            assert sorted(task.name for task in tasks) == sorted(expected)  # each once, none elsewhere
            assert all(task.state.is_completed() for task in tasks)
        # The block waited for the server to record its task runs, so the count is final.
        assert count_task_runs(client, run_flow_runs(run.id)) == 3 * len(stages) + 2 + 3

        keys = [artifact_key("golden", kind) for kind in ("iterations", "progress", "summary", "samples")]
        on_run = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)))
        assert {a.key for a in on_run} == set(keys) and all(a.flow_run_id == run.id for a in on_run)
        table = next(a for a in on_run if a.key == keys[0])
        assert [row["iteration"] for row in json.loads(table.data)] == [1, 2, 3]
        for name, iterations in (("iterations 1-2", [1, 2]), ("iteration 3", [3])):
            (block_table,) = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[by_name[name].id]))
            )
            assert block_table.key is None and [row["iteration"] for row in json.loads(block_table.data)] == iterations
