"""The iteration's actor calls are all queued before any is awaited
(flows/iteration.py). These tests hold the guarantees that design rests on, with real
Ray actors: a failed update never publishes weights (S-FLOW-6), the failure is named
by the stage that raised it, and a good iteration ends with the rollout holding the
newly published version.

Both tests use one set of actors (a module fixture; start-up is most of their cost):
the good iteration runs second, on actors that have just seen a failed update, so a
failure that left any of them half-updated fails it too.
"""

import pytest
import ray

from tests.conftest import TINY_PROFILE, short_run_overrides


@pytest.fixture(scope="module")
def roles(ray_cluster, role_process_pool, tiny_model_dir, tmp_path_factory):
    from configs.loading import load_config
    from processes.actors import start_role_actors, stop_role_actors
    from tests.support.process_pool import keep_role_processes

    overrides = short_run_overrides(tmp_path_factory.mktemp("dispatch"), tiny_model_dir)
    config = load_config(TINY_PROFILE, overrides + ["job.name=dispatch-guard"])
    with keep_role_processes(role_process_pool):
        handles = start_role_actors(config)
        yield config, handles
        stop_role_actors(handles)


def test_a_failed_update_publishes_nothing_and_the_rollout_keeps_its_version(roles):
    from flows.failures import StageFailed
    from flows.iteration import ppo_iteration
    from tests.support.actor_runner import ActorRunner

    config, handles = roles
    # 16 samples cannot be cut into minibatches of 5: both trainers raise. The preflight
    # would refuse this config; a copy skips validation so the actors meet it.
    rl = config.rl.model_copy(update={"minibatch_size": 5, "micro_batch_size": 5})
    config = config.model_copy(update={"rl": rl})
    with pytest.raises(
        StageFailed, match=r"^train_policy\[iter=1\] failed: ValueError: .*not a multiple of the minibatch size 5"
    ):
        ppo_iteration(ActorRunner(), handles, config, 1, 0)
    assert ray.get(handles.policy.current_weights.remote())[1] == 0  # publish_weights took the failed receipt
    assert ray.get(handles.rollout.ready.remote())["policy_version"] == 0


def test_a_good_iteration_ends_with_the_rollout_on_the_published_version(roles):
    from flows.iteration import ppo_iteration
    from tests.support.actor_runner import ActorRunner

    config, handles = roles
    result = ppo_iteration(ActorRunner(), handles, config, 1, 0)
    assert result.policy_version == 1 and result.record["train/policy_version"] == 1.0
    assert ray.get(handles.rollout.ready.remote())["policy_version"] == 1
