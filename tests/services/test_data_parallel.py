"""Data-parallel trainers (S-FLOW-5, S-SCALE-1): two FSDP2-sharded ranks per trainer
(and for the frozen reference) on the host (gloo), as real Ray actors in one process
group per role; and two rollout engines, one shard of every batch each.

What a user relies on: two ranks train as one rank would on the same batch (within
1e-5), each rank holding half of the state, the weights gathered from both ranks'
shards are what the engines get, the controller checks every rank's receipt, and a
run with two ranks commits a sharded (DCP) boundary and resumes like any other.
"""

from __future__ import annotations

import json

import pytest
import ray
import torch

from placement.plan import TRAINER_ROLES
from tests.conftest import TINY_PROFILE
from tests.support.helpers import metric_records

# Each rank's shard (minibatch 8 / 2 ranks) is exactly one one-rank micro-batch, so
# both layouts sum the very same micro-batch gradients.
SHARD_ALIGNED = ["rl.minibatch_size=8", "rl.micro_batch_size=4"]


def _start(tiny_overrides, *extra: str):
    from configs.loading import load_config
    from processes.actors import start_role_actors

    config = load_config(TINY_PROFILE, tiny_overrides + SHARD_ALIGNED + list(extra))
    return config, start_role_actors(config)


def _one_iteration(config, roles, runner) -> dict:
    from flows.iteration import ppo_iteration

    # The flow's own iteration program; every stage body checks every rank's receipt
    # (same batch, same optimizer step) or fails the iteration.
    return ppo_iteration(runner, roles, config, 1, 0).record


def test_two_ranks_train_exactly_like_one_and_stay_identical(ray_cluster, reused_role_processes, tiny_overrides):
    from configs.loading import load_config
    from flows.in_process import build_roles
    from flows.in_process_runner import InProcessRunner
    from tests.support.actor_runner import ActorRunner
    from processes.actors import stop_role_actors

    # One rank: the role bodies in this process (the actors compute exactly this:
    # test_flow_matches_in_process.py), so only the two-rank side starts actors.
    one_config = load_config(TINY_PROFILE, tiny_overrides + SHARD_ALIGNED + ["job.name=dp-one"])
    one = build_roles(one_config)
    two_config, two = _start(
        tiny_overrides, "job.name=dp-two", "grid.cpu_trainer_ranks=2", "grid.cpu_reference_ranks=2"
    )
    try:
        assert [ray.get(h.ready.remote())["ranks"] for h in two.ranks("policy")] == [2, 2]
        # S-SCALE-1: the frozen reference is sharded over its own two ranks too.
        assert [ray.get(h.ready.remote())["ranks"] for h in two.ranks("reference")] == [2, 2]
        assert [ray.get(h.ready.remote())["rank"] for h in two.ranks("critic")] == [0, 1]
        one_record = _one_iteration(one_config, one, InProcessRunner())
        two_record = _one_iteration(two_config, two, ActorRunner())
        assert one_record["train/reward_mean"] == two_record["train/reward_mean"]  # same seed: the same rollout

        for role in TRAINER_ROLES:
            # What the collectives cost is reported only where there are collectives.
            assert f"perf/{role}_grad_sync_seconds" not in one_record
            assert two_record[f"perf/{role}_grad_sync_seconds"] >= 0
        trained = [k for k in one_record if k.startswith(("train/policy_", "train/value_", "train/critic_", "optim/"))]
        trained.append("train/kl")  # against the two sharded reference ranks' log-probs
        assert "train/policy_loss" in trained and "train/value_loss" in trained
        for key in trained:
            # Rank 0 reports the whole update (diagnostics summed over the shards): the
            # one-rank update's loss, clip fraction, grad norm, lr and step.
            assert two_record[key] == pytest.approx(one_record[key], rel=1e-5, abs=1e-7), key

        one_published, one_version = one.policy.current_weights()
        # Both ranks gather the full weights from their shards at once (a collective);
        # rank 0 publishes them bucket by bucket through the object store (S-SCALE-3),
        # rank 1 publishes nothing.
        (rank0_published, rank0_version), (rank1_published, rank1_version) = ray.get(
            [rank.current_weights.remote() for rank in two.ranks("policy")]
        )
        assert one_version == rank0_version == rank1_version == 1
        assert rank1_published.buckets == 0 and rank0_published.names == one_published.names
        assert all(isinstance(ref, ray.ObjectRef) for ref in rank0_published.stored)
        rank0_weights = {name: tensor for bucket in rank0_published.fetch() for name, tensor in bucket.items()}
        for bucket in one_published.fetch():
            for name, tensor in bucket.items():
                torch.testing.assert_close(rank0_weights[name], tensor, rtol=1e-5, atol=1e-7)
    finally:
        stop_role_actors(two)


def test_a_critic_free_two_rank_policy_keeps_one_adaptive_kl_coefficient(
    ray_cluster, reused_role_processes, tiny_overrides
):
    """S-OPT-1/S-OPT-2 across ranks: without a critic, rank 1 of the policy receives rank
    0's targets; the adaptive KL coefficient each rank steps in prepare_batch is the same
    on both, and two iterations report what one rank computes."""
    from configs.loading import load_config
    from flows.in_process import build_roles
    from flows.in_process_runner import InProcessRunner
    from flows.iteration import ppo_iteration
    from tests.support.actor_runner import ActorRunner
    from processes.actors import stop_role_actors

    options = ["rl.advantage_estimator=reinforce_plus_plus", "rl.kl_target=0.001", "rl.kl_horizon=64"]
    one_config = load_config(TINY_PROFILE, tiny_overrides + SHARD_ALIGNED + options + ["job.name=dpkl-one"])
    one = build_roles(one_config)
    two_config, two = _start(tiny_overrides, *options, "job.name=dpkl-two", "grid.cpu_trainer_ranks=2")
    try:
        assert two.critic is None and len(two.policy_ranks()) == 2
        one_runner, two_runner = InProcessRunner(), ActorRunner()
        for iteration in (1, 2):
            one_record = ppo_iteration(one_runner, one, one_config, iteration, iteration - 1).record
            two_record = ppo_iteration(two_runner, two, two_config, iteration, iteration - 1).record
            assert "train/value_loss" not in two_record
            for key in ("train/kl_coef", "train/kl", "train/policy_loss", "train/reward_mean"):
                assert two_record[key] == pytest.approx(one_record[key], rel=1e-5, abs=1e-7), (iteration, key)
        coefficients = ray.get([rank.__ray_call__.remote(lambda self: self.kl_coef) for rank in two.policy_ranks()])
        assert coefficients[0] == coefficients[1] == pytest.approx(one.policy.kl_coef, rel=1e-6)
    finally:
        stop_role_actors(two)


def test_the_controller_refuses_ranks_that_disagree_on_the_step():
    from tasks.stages import check_receipts
    from contracts.trajectory import TrainReceipt

    batch = "iter000003-aaaaaaaaaaaaaaaa"
    check_receipts([TrainReceipt("policy", batch, 0, 4, {}), TrainReceipt("policy", batch, 1, 4, {})], batch, 3)
    with pytest.raises(RuntimeError, match=r"policy ranks disagree on the optimizer step \{0: 4, 1: 3\}"):
        check_receipts([TrainReceipt("policy", batch, 0, 4, {}), TrainReceipt("policy", batch, 1, 3, {})], batch, 3)


@pytest.mark.slow  # the default suite keeps two ranks through the flow in test_two_ranks_train_exactly_like_one
def test_a_two_rank_run_commits_and_resumes(prefect_api, ray_cluster, reused_role_processes, tiny_overrides, tmp_path):
    from flows.training import ppo

    # Two ranks per trainer and two rollout engines, each generating half of every batch.
    overrides = tiny_overrides + SHARD_ALIGNED + [
        "grid.cpu_trainer_ranks=2", "grid.cpu_rollout_engines=2", "job.name=dp-run", "rl.save_every=2",
    ]
    first = ppo(profile=TINY_PROFILE, overrides=overrides + ["rl.max_steps=2"], critic_warmup_iterations=1)
    assert first["policy_version"] == 1
    # S-SCALE-2: each rank wrote its own shard beside one .metadata, all vouched for.
    boundary = tmp_path / "outputs" / "dp-run" / "checkpoints" / "iter_000002"
    for role in TRAINER_ROLES:
        assert sorted(p.name for p in (boundary / role / "model").iterdir()) == [
            ".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert "policy/model/__1_0.distcp" in json.loads((boundary / "_SUCCESS").read_text())["files"]
    # Resume loads the boundary into both ranks of each trainer and the weights into both
    # engines; a rank or an engine left behind fails the next iteration (receipts, or
    # the rollout's version check).
    second = ppo(profile=TINY_PROFILE, overrides=overrides + ["rl.max_steps=3"], critic_warmup_iterations=1)
    assert second["resumed_from"].endswith("iter_000002") and second["policy_version"] == 2
    records = metric_records(tmp_path / "outputs" / "dp-run")
    assert [r["iteration"] for r in records] == [1, 2, 3]
    assert [r["train/actor_warmup"] for r in records] == [1.0, 0.0, 0.0]
    assert all(r["rollout/engines"] == 2.0 for r in records) and records[-1]["rollout/policy_version"] == 1.0
    assert records[-1]["optim/policy_optimizer_step"] == 4.0 and records[-1]["optim/critic_optimizer_step"] == 6.0


@pytest.mark.slow
@pytest.mark.parametrize("resumed_ranks", [1, 4])
def test_a_two_rank_boundary_resumes_on_other_rank_counts_like_an_uninterrupted_run(
    prefect_api, ray_cluster, tiny_overrides, tmp_path, resumed_ranks
):
    """S-SCALE-2, issue 17 items 3 and 4: started with grid.cpu_trainer_ranks=2, resumed
    with 1 or 4 ranks from the sharded (DCP) boundary, the run ends within 1e-3 of a
    1-rank run."""
    from safetensors.torch import load_file

    from flows.training import ppo
    from tests.support.helpers import boundary

    common = tiny_overrides + SHARD_ALIGNED + ["rl.save_every=2"]
    resharded = common + ["job.name=dp-reshard"]
    ppo(profile=TINY_PROFILE, overrides=resharded + ["grid.cpu_trainer_ranks=2", "rl.max_steps=2"])
    resumed = ppo(
        profile=TINY_PROFILE, overrides=resharded + [f"grid.cpu_trainer_ranks={resumed_ranks}", "rl.max_steps=4"]
    )
    assert resumed["resumed_from"].endswith("iter_000002")
    ppo(profile=TINY_PROFILE, overrides=common + ["job.name=dp-one-rank", "rl.max_steps=4"])

    outputs = tmp_path / "outputs"
    assert (boundary(outputs / "dp-reshard", 2) / "policy" / "model" / ".metadata").exists()
    if resumed_ranks > 1:  # the resumed run's own boundary: one shard file per rank it ran on
        shards = sorted((boundary(outputs / "dp-reshard", 4) / "policy" / "model").glob("*.distcp"))
        assert len(shards) == resumed_ranks
    for role in TRAINER_ROLES:
        want = load_file(boundary(outputs / "dp-one-rank", 4) / role / "model.safetensors")
        got = _full_weights(boundary(outputs / "dp-reshard", 4) / role, want)
        for name, tensor in want.items():
            torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-3, msg=f"{role} {name}")
    rows = {name: metric_records(outputs / name) for name in ("dp-reshard", "dp-one-rank")}
    assert [r["iteration"] for r in rows["dp-reshard"]] == [1, 2, 3, 4]
    for got, want in zip(rows["dp-reshard"], rows["dp-one-rank"]):
        assert got["train/reward_mean"] == want["train/reward_mean"]  # the same samples all the way


def _full_weights(role_dir, like: dict) -> dict:
    """A role's saved weights as whole tensors: the one-rank file, or the DCP shards of
    several ranks reassembled in this process."""
    from safetensors.torch import load_file

    from checkpoint.dcp_io import load_tensors

    if (role_dir / "model.safetensors").exists():
        return load_file(role_dir / "model.safetensors")
    state = {name: torch.empty_like(tensor) for name, tensor in like.items()}
    load_tensors(state, str(role_dir / "model"), alone=True)
    return state
