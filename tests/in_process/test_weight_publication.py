"""Weight publication as a stream of bounded buckets (S-SCALE-3, S-FLOW-6), with the
real policy and rollout role bodies in process: with a small bucket the rollout gets
the new weights in several buckets and ends holding exactly the policy's; a
publication that misses a bucket or carries one twice is refused naming a weight,
before the engine's weights or its policy_version change."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from algorithm.update_plan import UpdatePlan
from configs.loading import load_config
from tests.conftest import TINY_PROFILE, first_rank
from weights.publication import WeightPublicationError

BUCKET_MIB = 0.02  # about 21 KB: the tiny model (about 0.5 MB) arrives in many buckets


@pytest.fixture(scope="module")
def roles(tiny_model_dir, tmp_path_factory):
    from roles.policy_role import PolicyRole
    from roles.rollout_role import RolloutRole

    config = load_config(TINY_PROFILE, [
        f"model.path={tiny_model_dir}", f"job.output_root={tmp_path_factory.mktemp('outputs')}",
        f"rl.rollout.weight_sync_bucket_mib={BUCKET_MIB}",
    ])
    policy = PolicyRole(config, first_rank(config, "policy"))
    # One update, so the published weights differ from those the engine started with.
    policy.runtime.run_plan(UpdatePlan(1, 2, 2, 0, 1), _targets(policy), _loss(policy))
    return policy, RolloutRole(config, first_rank(config, "rollout"))


def _targets(policy):
    from types import SimpleNamespace

    ids = torch.randint(0, policy.model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    return SimpleNamespace(
        num_samples=2, input_ids=ids, attention_mask=torch.ones_like(ids), prompt_length=1,
        response_mask=torch.ones(2, 5), extras={},
    )


def _loss(policy):
    from tests.in_process.fsdp_ranks import language_model_loss

    return language_model_loss(policy.model)


def _weights_differ(policy, rollout) -> bool:
    engine = rollout.engine.model.state_dict()
    return any(not torch.equal(engine[name], tensor) for name, tensor in policy.model.state_dict().items())


def test_the_rollout_loads_several_buckets_and_ends_with_the_policys_weights(roles):
    policy, rollout = roles
    published, version = policy.current_weights()
    assert published.buckets > 4
    bound = int(BUCKET_MIB * 2**20)
    largest = max(t.numel() * t.element_size() for t in policy.model.state_dict().values())
    # Policy side: no bucket above the bound, unless one tensor alone is bigger.
    assert max(published.sizes) <= max(bound, largest)
    assert _weights_differ(policy, rollout)

    metrics = rollout.load_weights(published, version + 1)
    assert metrics["perf/weight_sync_buckets"] == published.buckets
    assert metrics["perf/weight_sync_bytes"] == published.bytes
    engine = rollout.engine.model.state_dict()
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(engine[name], tensor), name
    assert rollout.policy_version == version + 1


@pytest.mark.parametrize("fault", ["missing", "duplicated"])
def test_a_missing_or_duplicated_bucket_is_refused_naming_the_weight(roles, fault):
    policy, rollout = roles
    published, version = policy.current_weights()
    index = 3
    names, sizes, stored = list(published.names), list(published.sizes), list(published.stored)
    if fault == "missing":
        del names[index], sizes[index], stored[index]
        expected = rf"never arrive, first '{published.names[index][0]}'"
    else:
        for column in (names, sizes, stored):
            column.insert(index + 1, column[index])
        expected = rf"'{published.names[index][0]}' arrives twice \(buckets {index} and {index + 1}"
    broken = dataclasses.replace(published, names=tuple(names), sizes=tuple(sizes), stored=tuple(stored))
    before = {name: tensor.clone() for name, tensor in rollout.engine.model.state_dict().items()}
    held = rollout.policy_version
    with pytest.raises(WeightPublicationError, match=expected):
        rollout.load_weights(broken, held + 7)
    assert rollout.policy_version == held  # refused before anything was copied in
    for name, tensor in rollout.engine.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_a_bucket_that_does_not_hold_what_the_manifest_names_is_refused(roles):
    policy, _ = roles
    published, _ = policy.current_weights()
    first = dict(published.stored[0])
    dropped = next(iter(first))
    del first[dropped]
    broken = dataclasses.replace(published, stored=(first, *published.stored[1:]))
    with pytest.raises(WeightPublicationError, match=rf"bucket 0 of {published.buckets} .*missing \['{dropped}'\]"):
        list(broken.fetch())
