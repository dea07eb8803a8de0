"""A reward function that raises (issue 46, S-BYO-3): named with the callable, the
exception, the row and the completion; a rerun would raise again, so the run ends
without the resume hint; `rl.reward.on_error=zero` scores it as incorrect instead."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from configs.loading import load_config
from contracts.faults import repeats_on_rerun
from contracts.trajectory import PromptBatch, Trajectory
from flows.failures import StageFailed, naming_failures
from roles.reward_role import RewardRole
from tasks import stages
from tests.support.user_project import write_user_project


@pytest.fixture
def own_path(monkeypatch):
    """The profile's folder joins the path while the test runs, and leaves it after."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def _trajectory(completions: list[str]) -> Trajectory:
    b = len(completions)
    prompts = PromptBatch(1, ["1 plus 1?"] * b, ["2"] * b, [{}] * b, [10 + i for i in range(b)],
                          [f"questions.jsonl row {10 + i}" for i in range(b)])
    ones = torch.ones(b, 2, dtype=torch.long)
    return Trajectory.one_turn(
        iteration=1, policy_version=0, prompts=prompts, prompt_ids=ones, prompt_mask=ones,
        response_ids=ones, response_mask=torch.ones(b, 2), rollout_logprobs=torch.zeros(b, 2),
        completions=completions,
    )


def test_a_raising_reward_is_named_with_row_and_completion_and_repeats(tmp_path, user_models, own_path):
    profile = write_user_project(tmp_path / "mine", user_models.plain, module="raising_reward_a")
    role = RewardRole(load_config(profile))  # the module beside the profile imports, PYTHONPATH unset
    long_blank = " " * 300
    with pytest.raises(StageFailed) as failed:
        with naming_failures("reward", 1):
            role.score(_trajectory(["2", long_blank]))
    message = str(failed.value)
    assert message.startswith("reward[iter=1] failed: RewardCallableFailed: reward 'raising_reward_a:score' raised "
                              "IndexError: string index out of range on row 11 (questions.jsonl row 11), completion ")
    assert "... (300 characters)" in message  # shortened, and its length said
    assert "rl.reward.on_error=zero" in message
    assert failed.value.repeats and repeats_on_rerun(failed.value.__cause__)


def test_on_error_zero_scores_it_incorrect_counts_and_logs_the_first_few(tmp_path, user_models, own_path, caplog):
    profile = write_user_project(tmp_path / "mine", user_models.plain, module="raising_reward_b", on_error="zero")
    role = RewardRole(load_config(profile))
    scored, summary = role.score(_trajectory(["2", "", "", "", "", "3"]))
    assert scored.sequence_scores.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # The reward task logs the first three with their rows (the UI shows a task's log,
    # never an actor's) and records the count; the events are no metric.
    with caplog.at_level(logging.WARNING, logger="ppo.stages"):
        metrics = stages.reward(1, summary, {})
    assert metrics["reward/errors"] == 4.0 and metrics["reward/fraction_correct"] == pytest.approx(1 / 6)
    assert not any(key.endswith("events") for key in metrics)
    logged = [record.getMessage() for record in caplog.records]
    assert len(logged) == 3 and "on row 11 (questions.jsonl row 11)" in logged[0]
    assert logged[-1].endswith("later ones are only counted (reward/errors)")
    _, later = role.score(_trajectory([""]))
    assert later["reward/errors"] == 1.0 and stages.reward(2, later, {})["reward/errors"] == 1.0  # counted only
    assert len(caplog.records) == 3


def test_a_fault_a_rerun_gets_past_keeps_the_resume_hint():
    with pytest.raises(StageFailed) as failed:
        with naming_failures("rollout", 2):
            raise TimeoutError("stage exceeded rl.stage_timeout_seconds")
    assert not failed.value.repeats
