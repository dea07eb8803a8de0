"""rl.loss_aggregation (S-PATH-2) and the token-budget cut (S-PATH-3) on hand-built
tensors, with the expected numbers worked out in the comments."""

from __future__ import annotations

import typing

import pytest
import torch

from algorithm.loss_aggregation import LOSS_AGGREGATIONS, loss_aggregation
from algorithm.ppo_math import masked_mean
from algorithm.token_budget import RowTooLong, cut_by_tokens, split_to, trimmed_columns
from algorithm.update_plan import UpdatePlan, held_shape
from configs.loading import ConfigError, load_config
from configs.schema import RLConfig
from tests.conftest import TINY_PROFILE

# Two sequences: the first has 3 loss tokens (losses 1, 2, 3), the second 1 (loss 8).
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [8.0, 5.0, 7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
BUDGET = 4  # the generation budget C of sequence_mean_token_sum_norm


def _whole(name: str) -> float:
    aggregation = loss_aggregation(name)
    return float(aggregation.share(PER_TOKEN, MASK, aggregation.normaliser(MASK, BUDGET)))


def test_each_aggregation_by_hand():
    assert _whole("token_mean") == pytest.approx((1 + 2 + 3 + 8) / 4)  # 3.5: every token weighs the same
    assert _whole("sequence_mean_token_mean") == pytest.approx((2 + 8) / 2)  # 5: each sequence's mean, averaged
    assert _whole("sequence_mean_token_sum") == pytest.approx((6 + 8) / 2)  # 7: each sequence's sum, averaged
    assert _whole("sequence_mean_token_sum_norm") == pytest.approx((6 / 4 + 8 / 4) / 2)  # 1.75: sums over C


@pytest.mark.parametrize("name", list(LOSS_AGGREGATIONS))
def test_shares_of_the_rows_add_up_to_the_whole(name):
    """One micro-batch per sequence: the normaliser is the whole minibatch's, so the
    two shares sum to the minibatch's loss."""
    aggregation = loss_aggregation(name)
    normaliser = aggregation.normaliser(MASK, BUDGET)
    shares = [aggregation.share(PER_TOKEN[row : row + 1], MASK[row : row + 1], normaliser) for row in (0, 1)]
    assert float(sum(shares)) == pytest.approx(_whole(name), rel=1e-7)


def test_token_mean_of_one_micro_batch_is_masked_mean_to_the_bit():
    """The default with one micro-batch per minibatch computes today's loss exactly."""
    generator = torch.Generator().manual_seed(0)
    per_token = torch.randn(5, 7, generator=generator)
    mask = (torch.rand(5, 7, generator=generator) > 0.3).float()
    aggregation = loss_aggregation("token_mean")
    share = aggregation.share(per_token, mask, aggregation.normaliser(mask, 1))
    assert torch.equal(share, masked_mean(per_token, mask))


def test_a_sequence_without_loss_tokens_is_not_counted():
    """A row whose mask is all 0 adds nothing and is not one of the M sequences."""
    aggregation = loss_aggregation("sequence_mean_token_sum")
    mask = torch.cat([MASK, torch.zeros(1, 3)])
    per_token = torch.cat([PER_TOKEN, torch.full((1, 3), 100.0)])
    assert float(aggregation.share(per_token, mask, aggregation.normaliser(mask, BUDGET))) == pytest.approx(7.0)


def test_an_unknown_aggregation_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match="unknown loss aggregation 'seq-mean'; known: token_mean, sequence_mean_"):
        loss_aggregation("seq-mean")
    with pytest.raises(ConfigError) as refused:
        load_config(TINY_PROFILE, ["rl.loss_aggregation=seq-mean-token-mean"])
    message = str(refused.value)
    assert "rl.loss_aggregation" in message
    assert all(name in message for name in LOSS_AGGREGATIONS), message


def test_the_config_offers_exactly_the_registered_aggregations():
    offered = typing.get_args(RLConfig.model_fields["loss_aggregation"].annotation)
    assert list(offered) == list(LOSS_AGGREGATIONS)
    assert RLConfig.model_fields["loss_aggregation"].default == "token_mean"


def test_cut_by_tokens_groups_rows_by_length_shortest_first():
    # lengths 5 3 9 3 with a budget of 10: 3 (row 1) + 3 (row 3) = 6, + 5 > 10; 5; 9.
    assert cut_by_tokens([5, 3, 9, 3], 10) == [[1, 3], [0], [2]]
    assert cut_by_tokens([4, 4, 4], 12) == [[0, 1, 2]]  # exactly full
    assert cut_by_tokens([], 4) == []
    with pytest.raises(RowTooLong, match="row 2 holds 9 tokens, more than the budget of 8"):
        cut_by_tokens([5, 3, 9, 3], 8)


def test_split_to_halves_the_largest_group_until_the_count():
    assert split_to([[1, 3, 0], [2]], 3) == [[1], [3, 0], [2]]
    assert split_to([[0, 1], [2, 3]], 4) == [[0], [1], [2], [3]]  # ties: the first
    with pytest.raises(ValueError, match="cannot split 1 groups of 2 rows into 3"):
        split_to([[0, 1]], 3)


def test_trimmed_columns_drop_padding_shared_by_every_row():
    # prompt 4 columns (left-padded), response 3 (right-padded)
    attention = torch.tensor([
        [0, 0, 1, 1, 1, 1, 0],  # prompt 2, response 2
        [0, 1, 1, 1, 1, 0, 0],  # prompt 3, response 1
    ])
    assert trimmed_columns(attention, 4) == (1, 2)  # column 0 is padding in both rows; response column 2 too
    assert trimmed_columns(attention, 4, keep_prompt=True) == (0, 2)
    assert trimmed_columns(torch.tensor([[0, 0, 1, 0]]), 3) == (2, 1)  # one prompt column always stays


def test_token_budget_keeps_the_minibatches():
    attention = torch.ones(8, 6, dtype=torch.long)
    attention[::2, :2] = 0  # rows of 4 and 6 tokens
    plain = UpdatePlan(2, 4, 4, seed=1, outer_iteration=3)
    cut = UpdatePlan(2, 4, 4, seed=1, outer_iteration=3, micro_batch_tokens=10)
    for one, other in zip(plain.steps(8), cut.steps(8, 0, 1, attention, 3)):
        assert torch.equal(one.rows, other.rows)
        assert sorted(torch.cat([m.rows for m in other.micro_batches]).tolist()) == sorted(one.rows.tolist())
        assert all(int(attention[m.rows].sum()) <= 10 for m in other.micro_batches)


def test_a_boundary_before_loss_aggregation_reads_as_token_mean():
    assert held_shape([2, 8, 8]) == (2, 8, 8, "token_mean")
    assert held_shape([2, 8, 8, "sequence_mean_token_sum"]) == (2, 8, 8, "sequence_mean_token_sum")
    assert UpdatePlan(2, 8, 8, 0, 1).shape == held_shape([2, 8, 8])
