"""Whole-batch forwards cut by tokens (S-PATH-3): the reference's log-probs, the
critic's values and the policy's frozen log-probs come out the same whether the
batch is run whole or as trimmed, length-grouped micro-batches, with the real role
bodies on the tiny model."""

from __future__ import annotations

import pytest
import torch

from algorithm.token_budget import RowTooLong
from configs.loading import load_config
from contracts.faults import repeats_on_rerun
from models.cut_forward import cut_lengths_by_tokens, forward_by_tokens, token_micro_batches
from tests.conftest import TINY_PROFILE, first_rank

BATCH = ["rl.batch_size=8", "rl.minibatch_size=8", "rl.micro_batch_size=8", "rl.epochs=1"]


def _config(tiny_model_dir, output_root, *overrides: str):
    return load_config(
        TINY_PROFILE, [f"model.path={tiny_model_dir}", f"job.output_root={output_root}", *BATCH, *overrides]
    )


def _whole_batch_roles(config):
    from roles.critic_role import CriticRole
    from roles.policy_role import PolicyRole
    from roles.reference_role import ReferenceRole

    return (
        ReferenceRole(config, first_rank(config, "reference")),
        CriticRole(config, first_rank(config, "critic")),
        PolicyRole(config, first_rank(config, "policy")),
    )


@pytest.fixture(scope="module")
def scored(tiny_model_dir, tmp_path_factory):
    """A sampled, scored batch whose rows differ in length (prompt and response)."""
    from roles.data_role import DataRole
    from roles.replay_role import ReplayRole
    from roles.reward_role import RewardRole
    from roles.rollout_role import RolloutRole

    config = _config(tiny_model_dir, tmp_path_factory.mktemp("cut"), "rl.rollout.max_new_tokens=6")
    prompts, _ = DataRole(config).next_batch(1, 8)
    trajectory, _ = RolloutRole(config, first_rank(config, "rollout")).generate(prompts, 0)
    trajectory, _ = RewardRole(config).score(trajectory)
    trajectory, _, _ = ReplayRole(config).add(trajectory)
    return config, trajectory


def test_a_cut_batch_scores_as_the_whole_batch(scored, tiny_model_dir, tmp_path):
    config, trajectory = scored
    _, attention_mask = trajectory.sequences()
    lengths = attention_mask.sum(dim=1)
    budget = int(lengths.max()) + 2  # room for the longest row and little else
    micro_batches = token_micro_batches(attention_mask, trajectory.prompt_length, budget)
    # The cut is real: several micro-batches, and some narrower than the batch.
    assert len(micro_batches) > 2
    assert any(micro.trimmed for micro in micro_batches)
    assert sorted(torch.cat([micro.rows for micro in micro_batches]).tolist()) == list(range(8))

    results = []
    for overrides in ([], [f"rl.micro_batch_tokens={budget}"]):
        reference, critic, policy = _whole_batch_roles(_config(tiny_model_dir, tmp_path, *overrides))
        scored_here, _ = reference.score(trajectory)
        scored_here, _ = critic.predict(scored_here)
        targets, _ = policy.prepare_batch(scored_here)
        results.append((scored_here.ref_logprobs, scored_here.values, targets.old_logprobs, targets.advantages))
    for whole, cut in zip(*results):
        torch.testing.assert_close(cut, whole, rtol=1e-5, atol=1e-5)
    # Past each row's real tokens nothing is left from a wider neighbour.
    assert results[1][0][trajectory.response_mask == 0].abs().sum() == 0


def test_no_budget_is_the_one_whole_batch_call():
    calls = []

    def forward(ids, mask, prompt_length, rows):
        calls.append((ids.shape, prompt_length, rows))
        return torch.ones(ids.shape[0], ids.shape[1] - prompt_length)

    ids, mask = torch.ones(3, 7, dtype=torch.long), torch.ones(3, 7, dtype=torch.long)
    assert forward_by_tokens(forward, ids, mask, 4, None).shape == (3, 3)
    assert calls == [((3, 7), 4, None)]


def test_a_row_longer_than_the_budget_is_refused_naming_both():
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    with pytest.raises(RowTooLong, match=r"rl.micro_batch_tokens: row 1 holds 5 tokens.*budget of 4") as refused:
        token_micro_batches(mask, 2, budget=4)
    assert repeats_on_rerun(refused.value)  # a rerun meets the same row: what to fix, not the resume hint


def test_texts_are_grouped_by_tokens_or_counted():
    # without a budget: `rows_per_forward` at a time, in order; with one: shortest first
    assert cut_lengths_by_tokens([5, 3, 9, 3], None, 3) == [[0, 1, 2], [3]]
    assert cut_lengths_by_tokens([5, 3, 9, 3], 10, 3) == [[1, 3], [0], [2]]
