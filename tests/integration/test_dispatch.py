"""The iteration's actor calls are queued before any is awaited (tasks.stages.
dispatch_iteration). These tests hold the guarantees that design rests on, with real
Ray actors: a failed update never publishes weights (S-FLOW-6), and a good iteration
ends with the rollout holding the newly published version."""

import pytest
import ray

from tests.conftest import TINY_PROFILE

pytestmark = [pytest.mark.ray]


@pytest.fixture
def roles(ray_cluster, tiny_overrides):
    from configs.loading import load_config
    from roles.actors import start_role_actors, stop_role_actors

    config = load_config(TINY_PROFILE, tiny_overrides + ["job.name=dispatch-guard"])
    handles = start_role_actors(config)
    yield config, handles
    stop_role_actors(handles)


def _plan(config, minibatch_size: int):
    from algorithm.update_plan import UpdatePlan

    rl = config.rl
    return UpdatePlan(rl.epochs, minibatch_size, min(rl.micro_batch_size, minibatch_size), config.job.seed, 1)


def test_a_failed_update_publishes_nothing_and_the_rollout_keeps_its_version(roles):
    from tasks.stages import dispatch_iteration

    config, handles = roles
    # 16 samples cannot be cut into minibatches of 5: both trainers raise.
    calls = dispatch_iteration(handles, 1, config.rl.batch_size, 0, _plan(config, 5), actor_warmup=False)
    with pytest.raises(ValueError, match="not a multiple of the minibatch size 5"):
        ray.get(calls.receipts["policy"])
    with pytest.raises(ValueError, match="not a multiple"):
        ray.get(calls.summaries["weight_sync"])  # publish_weights took the failed receipt
    assert ray.get(handles.policy.current_weights.remote())[1] == 0
    assert ray.get(handles.rollout.ready.remote())["policy_version"] == 0


def test_a_good_iteration_ends_with_the_rollout_on_the_published_version(roles):
    from tasks.stages import dispatch_iteration

    config, handles = roles
    calls = dispatch_iteration(handles, 1, config.rl.batch_size, 0, _plan(config, config.rl.minibatch_size), False)
    receipts = ray.get(calls.receipts["policy"] + calls.receipts["critic"])
    assert len({receipt.batch_id for receipt in receipts}) == 1
    assert ray.get(calls.policy_version) == 1
    ray.get(calls.summaries["weight_sync"])
    assert ray.get(handles.rollout.ready.remote())["policy_version"] == 1
