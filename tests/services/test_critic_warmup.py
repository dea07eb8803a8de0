"""Critic warmup through the real flow (S-CW-1..6): exactly N critic-only iterations."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from checkpoint.digest import state_digest
from checkpoint.role_state import model_tensors
from configs.schema import OptimizerConfig
from models.model_io import load_causal_lm
from trainer.update_runtime import build_optimizer, build_scheduler
from tests.conftest import TINY_PROFILE, short_run_overrides
from tests.support.helpers import (
    boundary,
    metric_records,
    optimizer_state,
    trainer_state,
    weights_digest,
)


@pytest.fixture(scope="module")
def warmup_run(prefect_api, ray_cluster, role_process_pool, tiny_model_dir, tmp_path_factory):
    """N=2, 4 iterations, a boundary after every iteration so each state can be read."""
    from flows.training import ppo
    from tests.support.process_pool import keep_role_processes

    root = tmp_path_factory.mktemp("warmup")
    every_iteration = ["rl.max_steps=4", "rl.save_every=1", "rl.keep_optim_last=0"]
    overrides = short_run_overrides(root, tiny_model_dir) + every_iteration
    with keep_role_processes(role_process_pool):
        ppo(profile=TINY_PROFILE, overrides=overrides, critic_warmup_iterations=2, run_name="warmup2")
    return root / "warmup2"


def _initial_policy_digest(model_dir: str) -> str:
    return state_digest(model_tensors(load_causal_lm(model_dir, "float32")))


def test_policy_is_byte_for_byte_unchanged_through_warmup_and_moves_after(warmup_run: Path, tiny_model_dir):
    initial = _initial_policy_digest(tiny_model_dir)
    digests = [weights_digest(boundary(warmup_run, i) / "policy") for i in (1, 2, 3, 4)]
    assert digests[0] == initial and digests[1] == initial  # S-CW-2
    assert digests[2] != initial and digests[3] != digests[2]

    fresh_optimizer = build_optimizer(load_causal_lm(tiny_model_dir, "float32").parameters(), OptimizerConfig(), 1e-3)
    fresh_scheduler = build_scheduler(fresh_optimizer, 0)
    for i in (1, 2):
        policy_dir = boundary(warmup_run, i) / "policy"
        assert optimizer_state(policy_dir)["state"] == {}
        assert trainer_state(policy_dir)["optimizer_pristine"] is True
        assert trainer_state(policy_dir)["optimizer_step"] == 0
        scheduler = torch.load(policy_dir / "scheduler.pt", weights_only=True)
        assert state_digest(scheduler) == state_digest(fresh_scheduler.state_dict())
    third = boundary(warmup_run, 3) / "policy"
    assert optimizer_state(third)["state"] != {} and trainer_state(third)["optimizer_step"] == 2


def test_critic_trains_every_iteration(warmup_run: Path):
    digests = [weights_digest(boundary(warmup_run, i) / "critic") for i in (1, 2, 3, 4)]
    assert len(set(digests)) == 4
    assert [trainer_state(boundary(warmup_run, i) / "critic")["optimizer_step"] for i in (1, 2, 3, 4)] == [2, 4, 6, 8]


def test_policy_version_and_weight_transfers_follow_the_two_clocks(warmup_run: Path):
    records = metric_records(warmup_run)
    assert [r["train/policy_version"] for r in records] == [0.0, 0.0, 1.0, 2.0]  # S-CW-4
    # The rollout counts every weight load it received: none before iteration 3's update (S-CW-5).
    assert [r["perf/rollout_weight_loads"] for r in records] == [0.0, 0.0, 0.0, 1.0]
    assert [("perf/weight_sync_bytes" in r) for r in records] == [False, False, True, True]
    # Staleness guard is equality: each rollout sampled with exactly the current version.
    assert [r["rollout/policy_version"] for r in records] == [0.0, 0.0, 0.0, 1.0]


def test_warmup_metrics_follow_s_cw_6(warmup_run: Path):
    records = metric_records(warmup_run)
    assert [r["train/actor_warmup"] for r in records] == [1.0, 1.0, 0.0, 0.0]
    for record in records[:2]:
        policy_keys = [k for k in record if k.startswith("train/policy_") and k != "train/policy_version"]
        assert policy_keys == [] and "optim/policy_optimizer_step" not in record
        assert "train/value_loss" in record
    for record in records[2:]:
        assert "train/policy_loss" in record and "optim/policy_optimizer_step" in record


def test_task_history_shows_no_policy_training_or_weight_sync_during_warmup(warmup_run: Path):
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.recording import run_flow_runs

    async def task_names() -> set[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["warmup2"])))
            assert runs and runs[0].parameters["critic_warmup_iterations"] == 2
            # The stage tasks run inside the flow run's block subflows (flows/blocks.py).
            tasks = await client.read_task_runs(flow_run_filter=run_flow_runs(runs[0].id), limit=200)
            return {t.name for t in tasks}

    deadline = time.monotonic() + 30
    names: set[str] = set()
    while time.monotonic() < deadline:  # task-run history is written asynchronously
        names = asyncio.run(task_names())
        if "commit[iter=4]" in names:
            break
        time.sleep(1)
    for i in (1, 2):
        assert f"train_critic[iter={i}]" in names
        assert f"train_policy[iter={i}]" not in names and f"weight_sync[iter={i}]" not in names
    for i in (3, 4):
        assert f"train_policy[iter={i}]" in names and f"weight_sync[iter={i}]" in names


def test_warmup_covering_the_whole_run_leaves_the_actor_untouched(
    prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tiny_model_dir, tmp_path
):
    from flows.training import ppo

    summary = ppo(profile=TINY_PROFILE, overrides=tiny_overrides + ["rl.max_steps=2"],
                  critic_warmup_iterations=3, run_name="allwarmup")
    assert summary["actor_untouched"] is True and summary["policy_version"] == 0
    final = tmp_path / "outputs" / "allwarmup" / "checkpoints" / "iter_000002" / "policy"
    assert weights_digest(final) == _initial_policy_digest(tiny_model_dir)
