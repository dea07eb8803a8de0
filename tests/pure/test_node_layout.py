"""Which node each device group lands on when a run spans nodes (issue 17 item 5,
S-RUN-4): decided by the plan, without Ray, so where a role runs is the plan's choice
and not the scheduler's. The lowering onto a real two-node cluster is
tests/services/test_multinode.py (-m slow)."""

from __future__ import annotations

from configs.loading import load_config
from rundir.preflight import machine_problems
from placement.node_layout import host_slot, node_slots
from placement.plan import plan_placement
from placement.ray_lowering import LoweredPlacement
from tests.conftest import REPO_ROOT, TINY_PROFILE

PUBLIC_PROFILE = str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py")


def test_a_cpu_run_on_one_node_reserves_nothing():
    plan = plan_placement(load_config(TINY_PROFILE))
    assert plan.reserved_groups() == () and node_slots(plan) == {}


def test_a_cpu_run_on_two_nodes_reserves_cpu_bundles_and_spreads_the_groups():
    plan = plan_placement(load_config(TINY_PROFILE, ["grid.num_nodes=2"]))
    assert [group.name for group in plan.reserved_groups()] == ["actor", "reference", "critic"]
    # Least loaded node first, ties to the lower slot: the host roles join the rollout's node.
    assert node_slots(plan) == {"actor": (0,), "reference": (1,), "critic": (0,)}
    assert host_slot(plan) == 0
    disaggregated = plan_placement(load_config(TINY_PROFILE, ["grid.num_nodes=2", "grid.gpu_placement=disaggregated"]))
    assert node_slots(disaggregated) == {"policy": (0,), "rollout": (1,), "reference": (0,), "critic": (1,)}


def test_a_trainers_ranks_stay_on_one_node_and_a_colocated_bundle_is_split():
    plan = plan_placement(load_config(TINY_PROFILE, ["grid.num_nodes=2", "grid.cpu_trainer_ranks=2"]))
    assert node_slots(plan) == {"actor": (0, 0), "reference": (1,), "critic": (1, 1)}
    lowered = LoweredPlacement(plan, {name: object() for name in ("actor", "reference", "critic")}, host_node="ab" * 28)
    policy, rollout = lowered.actor_options("policy", 0), lowered.actor_options("rollout", 0)
    assert policy["num_cpus"] == rollout["num_cpus"] == 0.5  # engine 0 and policy rank 0 share CPU bundle 0
    assert policy["scheduling_strategy"].placement_group_bundle_index == 0
    assert lowered.actor_options("policy", 1)["scheduling_strategy"].placement_group_bundle_index == 1
    assert lowered.actor_options("critic", 1)["num_cpus"] == 1.0
    data = lowered.actor_options("data")
    assert data["num_cpus"] == 0 and data["scheduling_strategy"].node_id == "ab" * 28  # pinned, never the head


def test_gpu_groups_fill_a_node_before_the_next_and_spill_only_when_too_big():
    two_by_two = plan_placement(load_config(PUBLIC_PROFILE, ["grid.gpus_per_node=2", "grid.num_nodes=2"]))
    assert node_slots(two_by_two) == {"actor": (0, 0), "reference": (1,), "critic": (1,)}
    big = plan_placement(
        load_config(PUBLIC_PROFILE, ["grid.gpus_per_node=3", "grid.num_nodes=2", "grid.policy_gpus=4"])
    )
    assert node_slots(big) == {"actor": (0, 0, 0, 1), "reference": (1,), "critic": (1,)}  # HSDP across the two


def test_spreading_over_nodes_needs_a_named_cluster():
    config = load_config(TINY_PROFILE, ["grid.num_nodes=2"])
    (problem,) = machine_problems(config, environ={})
    assert problem.key == "grid.num_nodes" and "no Ray cluster is named" in problem.message
    assert machine_problems(config, environ={"RAY_ADDRESS": "10.0.0.1:6379"}) == []


def test_the_manifest_shows_each_slots_groups_before_any_node_is_contacted():
    from placement.node_layout import describe_slots

    plan = plan_placement(load_config(TINY_PROFILE, ["grid.num_nodes=2"]))
    assert describe_slots(plan) == "slot 0: policy+rollout, critic, data, reward, replay; slot 1: reference"
    big = plan_placement(
        load_config(PUBLIC_PROFILE, ["grid.gpus_per_node=3", "grid.num_nodes=2", "grid.policy_gpus=4"])
    )
    assert describe_slots(big).startswith("slot 0: policy+rollout (3 bundles), data, reward, replay; slot 1: ")
