"""A generated batch is checked before anything trains on it (S-ELASTIC-3): the rows
asked for, in order, each with a response token and finite log-probs; and the run's
summary lists the rollout faults it survived (S-ELASTIC-2)."""

from __future__ import annotations

import math

import pytest
import torch

from contracts.generated_rows import GeneratedRowError, check_generated
from contracts.trajectory import PromptBatch, Trajectory
from views.history import faults_survived, summary_markdown


def _batch(row_ids: list[int], mask: list[list[float]], logprobs: list[list[float]]) -> Trajectory:
    b = len(row_ids)
    prompts = PromptBatch(4, ["p"] * b, [None] * b, [{}] * b, row_ids)
    return Trajectory.one_turn(
        iteration=4, policy_version=2, prompts=prompts, prompt_ids=torch.ones(b, 2, dtype=torch.long),
        prompt_mask=torch.ones(b, 2), response_ids=torch.ones(b, 2, dtype=torch.long),
        response_mask=torch.tensor(mask), rollout_logprobs=torch.tensor(logprobs), completions=["c"] * b,
    )


def test_a_whole_batch_passes():
    # row 11 stopped after one token: its padding's log-prob is never looked at
    check_generated(_batch([10, 11], [[1, 1], [1, 0]], [[-0.1, -0.2], [-0.3, math.nan]]), [10, 11])


@pytest.mark.parametrize(
    "rows, mask, logprobs, message",
    [
        ([10, 12], [[1, 1], [1, 1]], [[0, 0], [0, 0]], r"missing \[11\], not asked for \[12\]"),
        ([11, 10], [[1, 1], [1, 1]], [[0, 0], [0, 0]], r"rows other than the batch asked for"),
        ([10, 11], [[1, 1], [0, 0]], [[0, 0], [0, 0]], r"row 11 \(batch position 1\) came back with no response"),
        ([10, 11], [[1, 1], [1, 1]], [[0, -math.inf], [0, 0]], r"row 10 \(batch position 0\) has a non-finite"),
    ],
)
def test_a_batch_with_a_failed_row_is_refused_naming_the_row(rows, mask, logprobs, message):
    with pytest.raises(GeneratedRowError, match=message):
        check_generated(_batch(rows, mask, logprobs), [10, 11])


def test_the_summary_lists_the_engines_lost_and_replaced():
    rows = [
        {"iteration": 1, "fault/rollout_engines_lost": 0.0, "fault/rollout_replace_seconds": 0.0},
        {"iteration": 2, "fault/rollout_engines_lost": 1.0, "fault/rollout_replace_seconds": 1.25},
    ]
    assert faults_survived(rows) == "1 rollout engine lost and replaced (iteration 2: 1, 1.2 s replacing)"
    assert "| faults survived | 1 rollout engine lost" in summary_markdown({"run_name": "r"}, rows, None, None)
    assert faults_survived([{"iteration": 1}]) == ""  # one engine, or elasticity off: no key, no line


def test_one_engine_or_elasticity_off_survives_no_loss_and_the_deadline_follows_the_stage():
    """S-ELASTIC-3: one engine, or rl.rollout.max_engine_replacements=0, replaces no engine."""
    from configs.loading import load_config
    from processes.engine_pool import elastic, engine_deadline
    from tests.conftest import TINY_PROFILE

    config = load_config(TINY_PROFILE, [])
    assert elastic(config, 2) and not elastic(config, 1)
    assert not elastic(load_config(TINY_PROFILE, ["rl.rollout.max_engine_replacements=0"]), 2)
    assert engine_deadline(config) == 75.0  # a quarter of the profile's 300 s stage timeout
    assert engine_deadline(load_config(TINY_PROFILE, ["rl.rollout.engine_timeout_seconds=5"])) == 5.0
    assert engine_deadline(load_config(TINY_PROFILE, ["rl.stage_timeout_seconds=null"])) is None


def test_a_loss_and_a_replacement_are_records_that_survive_json_and_read_as_the_log_lines():
    """S-ELASTIC-2: the pool reports records; the rollout task words them, also after the
    summary went through a boundary's JSON with the in-flight batch (S-ASYNC-3)."""
    import json
    import logging

    from contracts.rollout_faults import EngineLost, EngineReplaced, Regeneration, as_event, describe_event

    lost = EngineLost(1, "node 1a2b3c4d (10.0.0.5)", "its process is gone (The actor died)")
    lost.regenerated.append(Regeneration(2, 1, 2, 0, 3.04, 1.25))
    replaced = EngineReplaced(1, "node 1a2b3c4d (10.0.0.5)", 2, False, 4.5, 0.25)
    events = json.loads(json.dumps([as_event(lost), as_event(replaced)]))
    assert [describe_event(event) for event in events] == [
        (logging.WARNING, "lost rollout engine 1 on node 1a2b3c4d (10.0.0.5): its process is gone (The actor died); "
                          "iteration 2: shard 1 of 2 generated again on rollout engine 0 (3.0 s into the shard), "
                          "done after 1.2 s more"),
        (logging.INFO, "replacement rollout engine 1 is serving policy_version 2 on node 1a2b3c4d (10.0.0.5) "
                       "(started in 4.5 s, weights included; this call waited 0.2 s for it)"),
    ]
    assert describe_event(["warning", "lost rollout engine 0"]) == (logging.WARNING, "lost rollout engine 0")
