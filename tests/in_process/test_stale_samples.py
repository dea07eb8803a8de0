"""Version stamps and receipts (S-FLOW-5, S-FLOW-6), with the real role bodies run
in-process (a role body is an ordinary class; the Ray wrapper adds only placement).

A rollout made under policy_version k and offered to a trainer at k+1 is refused
with both versions named; a rollout asked for a version it does not hold refuses to
sample; a receipt naming another batch stops the iteration.
"""

from __future__ import annotations

import pytest

from algorithm.update_plan import UpdatePlan
from configs.loading import load_config
from roles.policy_role import PolicyRole, StaleSampleError
from contracts.trajectory import TrainReceipt
from tests.conftest import TINY_PROFILE, first_rank


@pytest.fixture(scope="module")
def config(tiny_model_dir, tmp_path_factory):
    output_root = tmp_path_factory.mktemp("stale-outputs")
    return load_config(
        TINY_PROFILE,
        [f"model.path={tiny_model_dir}", f"job.output_root={output_root}", "rl.batch_size=8", "rl.minibatch_size=8",
         "rl.micro_batch_size=8", "rl.epochs=1"],
    )


@pytest.fixture(scope="module")
def roles(config):
    from roles.critic_role import CriticRole
    from roles.data_role import DataRole
    from roles.reference_role import ReferenceRole
    from roles.replay_role import ReplayRole
    from roles.reward_role import RewardRole
    from roles.rollout_role import RolloutRole

    return {
        "data": DataRole(config),
        "rollout": RolloutRole(config, first_rank(config, "rollout")),
        "reward": RewardRole(config),
        "replay": ReplayRole(config),
        "reference": ReferenceRole(config, first_rank(config, "reference")),
        "critic": CriticRole(config, first_rank(config, "critic")),
    }


def scored_trajectory(roles, iteration: int, version: int):
    """One iteration's chain up to (not including) policy.prepare_batch."""
    prompts, _ = roles["data"].next_batch(iteration, 8)
    trajectory, _ = roles["rollout"].generate(prompts, version)
    trajectory, _ = roles["reward"].score(trajectory)
    trajectory, _, _ = roles["replay"].add(trajectory)
    trajectory, _ = roles["reference"].score(trajectory)
    trajectory, _ = roles["critic"].predict(trajectory)
    return trajectory


def test_samples_of_version_k_are_refused_by_a_policy_at_k_plus_1(config, roles):
    policy = PolicyRole(config, first_rank(config, "policy"))
    trajectory = scored_trajectory(roles, iteration=1, version=0)
    assert trajectory.policy_version == 0  # the rollout stamps the version its weights came from

    _, published = policy.publish_weights()  # an actor update was published: the policy is now at 1
    assert published == 1
    with pytest.raises(StaleSampleError) as caught:
        policy.prepare_batch(trajectory)
    message = str(caught.value)
    assert "policy_version 0" in message and "is at 1" in message
    # Nothing was frozen from the stale batch, so training on it is refused as well.
    with pytest.raises(ValueError, match=trajectory.batch_id):
        policy.train_batch(UpdatePlan(1, 8, 8, 0, 1), trajectory.batch_id)


def test_targets_frozen_at_k_are_not_trained_after_the_policy_moved_to_k_plus_1(config, roles):
    """The guard also holds at the train step: targets prepared under version k, then
    a publish (k+1), then train_batch on those targets is refused naming both."""
    policy = PolicyRole(config, first_rank(config, "policy"))
    trajectory = scored_trajectory(roles, iteration=2, version=roles["rollout"].policy_version)
    policy.policy_version = trajectory.policy_version
    policy.prepare_batch(trajectory)
    policy.publish_weights()
    with pytest.raises(StaleSampleError) as caught:
        policy.train_batch(UpdatePlan(1, 8, 8, 0, 2), trajectory.batch_id)
    message = str(caught.value)
    assert f"policy_version {trajectory.policy_version}" in message and f"{trajectory.policy_version + 1}" in message


def test_matching_versions_train_and_the_rollout_follows_weight_sync(config, roles):
    policy = PolicyRole(config, first_rank(config, "policy"))
    rollout = roles["rollout"]
    policy.policy_version = rollout.policy_version
    trajectory = scored_trajectory(roles, iteration=3, version=rollout.policy_version)
    targets, _ = policy.prepare_batch(trajectory)
    roles["critic"].install_targets(targets)
    receipt = policy.train_batch(UpdatePlan(1, 8, 8, 0, 3), trajectory.batch_id)
    assert receipt.batch_id == trajectory.batch_id

    weights, version = policy.publish_weights()
    metrics = rollout.load_weights(weights, version)
    assert rollout.policy_version == version
    expected_bytes = sum(t.numel() * t.element_size() for t in policy.model.state_dict().values())
    assert metrics["perf/weight_sync_bytes"] == float(weights.bytes) == float(expected_bytes) > 0


def test_rollout_refuses_to_sample_for_a_version_it_does_not_hold(roles):
    from roles.rollout_role import StalePolicyError

    rollout = roles["rollout"]
    prompts, _ = roles["data"].next_batch(4, 8)
    held = rollout.policy_version
    with pytest.raises(StalePolicyError) as caught:
        rollout.generate(prompts, held + 1)
    assert f"policy_version {held}" in str(caught.value) and f"requires {held + 1}" in str(caught.value)


def test_receipt_for_another_batch_is_a_mismatch():
    from tasks.stages import check_receipts

    agreed = "iter000005-aaaaaaaaaaaaaaaa"
    receipts = [TrainReceipt("policy", agreed, 0, 3, {}), TrainReceipt("critic", agreed, 0, 3, {})]
    check_receipts(receipts, agreed, 5)  # S-FLOW-5: all ranks name the whole batch: accepted

    receipts.append(TrainReceipt("critic", "iter000005-bbbbbbbbbbbbbbbb", 1, 3, {}))
    with pytest.raises(RuntimeError) as caught:
        check_receipts(receipts, agreed, 5)
    message = str(caught.value)
    assert "critic rank 1" in message and "iter000005-bbbbbbbbbbbbbbbb" in message and agreed in message
