import pytest
import torch

from algorithm.update_plan import UpdatePlan
from algorithm.warmup import expected_policy_version, is_critic_warmup


def _order(plan: UpdatePlan, n: int) -> list[int]:
    return torch.cat([torch.cat(mb) for mb in plan.minibatches(n)]).tolist()


def test_plan_covers_every_sample_once_per_epoch_in_micro_batches():
    plan = UpdatePlan(epochs=2, minibatch_size=4, micro_batch_size=2, seed=0, outer_iteration=1)
    schedule = plan.minibatches(8)
    assert len(schedule) == 4  # 2 epochs × 2 minibatches
    assert all(len(mb) == 2 and all(len(micro) == 2 for micro in mb) for mb in schedule)
    order = _order(plan, 8)
    assert sorted(order[:8]) == list(range(8)) and sorted(order[8:]) == list(range(8))


def test_shuffle_moves_with_the_outer_iteration_and_repeats_for_the_same_one():
    # S-FLOW-4: seeded by run seed + outer iteration, so it keeps moving during warmup.
    first = UpdatePlan(1, 8, 8, seed=0, outer_iteration=1)
    second = UpdatePlan(1, 8, 8, seed=0, outer_iteration=2)
    assert _order(first, 32) == _order(UpdatePlan(1, 8, 8, seed=0, outer_iteration=1), 32)
    assert _order(first, 32) != _order(second, 32)


def test_plan_refuses_a_batch_that_does_not_divide():
    with pytest.raises(ValueError, match="not a multiple of the minibatch size 4"):
        UpdatePlan(1, 4, 4, 0, 1).minibatches(6)


@pytest.mark.parametrize(
    "iteration, warmup, expected",
    [(1, 0, False), (1, 2, True), (2, 2, True), (3, 2, False), (5, 5, True), (6, 5, False)],
)
def test_warmup_predicate_is_exactly_iterations_1_to_n(iteration, warmup, expected):
    assert is_critic_warmup(iteration, warmup) is expected


def test_expected_policy_version_stands_still_during_warmup():
    assert [expected_policy_version(i, 2) for i in range(0, 5)] == [0, 0, 0, 1, 2]


def test_rank_shards_partition_each_minibatch_in_the_one_rank_order():
    # S-FLOW-5: the ranks' slices, side by side, are the one-rank minibatch, micro-batch
    # for micro-batch when a shard is a whole number of micro-batches.
    plan = UpdatePlan(epochs=2, minibatch_size=8, micro_batch_size=2, seed=3, outer_iteration=4)
    whole = plan.minibatches(16)
    shards = [plan.minibatches(16, rank, 2) for rank in range(2)]
    for step, minibatch in enumerate(whole):
        joined = shards[0][step] + shards[1][step]
        assert [m.tolist() for m in joined] == [m.tolist() for m in minibatch]
        assert not set(torch.cat(shards[0][step]).tolist()) & set(torch.cat(shards[1][step]).tolist())


def test_a_minibatch_that_does_not_split_over_the_ranks_is_refused():
    with pytest.raises(ValueError, match="minibatch size 8 does not split into 3 equal rank shards"):
        UpdatePlan(1, 8, 4, 0, 1).minibatches(16, 0, 3)
