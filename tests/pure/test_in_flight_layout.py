"""A one-step-off boundary written before every rollout became an episode (S-PATH-1)
still resumes: its in-flight batch is read back in today's layout, with the per-token
scores the reward role would lay out now (S-ASYNC-3)."""

from __future__ import annotations

import torch

from checkpoint.in_flight import _plain, _rebuilt
from contracts.trajectory import PromptBatch, Trajectory, Transcript


def _old_layout(**old_fields) -> dict:
    """A saved trajectory as the earlier code wrote it: `scores` and its companions."""
    today = Trajectory.one_turn(
        iteration=3, policy_version=2, prompts=PromptBatch(3, ["a", "b"], [None, None], [{}, {}], [0, 1]),
        prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1, dtype=torch.long),
        response_ids=torch.ones(2, 3, dtype=torch.long), response_mask=torch.tensor([[1.0, 1.0, 0.0], [1.0] * 3]),
        rollout_logprobs=torch.zeros(2, 3), completions=["x", "y"],
    )
    saved = _plain(today)
    for name in ("action_mask", "token_scores", "sequence_scores", "transcripts"):
        del saved[name]
    return {**saved, **old_fields}


def test_a_single_turn_batch_gets_its_score_on_the_last_token_plus_shaping():
    process = torch.tensor([[0.1, 0.2, 0.0], [0.1, 0.1, 0.1]])
    rebuilt = _rebuilt(_old_layout(scores=torch.tensor([1.0, 0.5]), process_rewards=process))
    # row 0 ends at token 1: 0.2 + 1.0; row 1 at token 2: 0.1 + 0.5
    torch.testing.assert_close(rebuilt.token_scores, torch.tensor([[0.1, 1.2, 0.0], [0.1, 0.1, 0.6]]))
    assert torch.equal(rebuilt.action_mask, rebuilt.response_mask)
    assert rebuilt.sequence_scores.tolist() == [1.0, 0.5] and rebuilt.transcripts == ()


def test_an_episode_batch_keeps_its_turn_rewards_mask_and_transcripts():
    actions, rewards = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]), torch.tensor([[0.0, 0.0, 1.0], [0.0] * 3])
    episode = {"messages": [{"role": "user", "content": "q"}], "turns": 2, "tool_calls": 1, "cut": False,
               "failed": False}
    rebuilt = _rebuilt(_old_layout(
        scores=torch.tensor([1.0, 0.0]), action_mask=actions, turn_rewards=rewards, episodes=[episode, episode],
    ))
    assert torch.equal(rebuilt.token_scores, rewards) and torch.equal(rebuilt.action_mask, actions)
    assert rebuilt.transcripts == (Transcript(**episode),) * 2
