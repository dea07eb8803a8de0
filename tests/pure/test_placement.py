"""Device groups from `grid.*` (S-RUN-4, S-RUN-5): the pure plan the manifest checks
and the actors are placed by. Lowering onto a Ray cluster is tested in
tests/services/test_placement_ray.py."""

from __future__ import annotations

import sys

import pytest

from configs.loading import load_config
from placement.plan import placement_problems, plan_placement
from placement.ray_lowering import LoweredPlacement
from tests.conftest import REPO_ROOT, TINY_PROFILE

PUBLIC_PROFILE = str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py")


def test_public_profile_is_two_colocated_gpus_plus_reference_plus_critic():
    plan = plan_placement(load_config(PUBLIC_PROFILE))
    assert [(g.name, g.roles, g.gpus) for g in plan.groups] == [
        ("actor", ("policy", "rollout"), 2),
        ("reference", ("reference",), 1),
        ("critic", ("critic",), 1),
    ]
    actor = plan.group_of("rollout")
    assert actor is plan.group_of("policy") and actor.fraction_per_role == 0.5  # both on the same device
    assert plan.total_gpus == 4 and plan.offload_active
    assert plan.ranks("policy") == 2 and plan.ranks("critic") == 1
    assert placement_problems(plan, load_config(PUBLIC_PROFILE)) == []


def test_disaggregated_gives_each_of_the_four_roles_its_own_group():
    config = load_config(
        PUBLIC_PROFILE, ["grid.gpu_placement=disaggregated", "grid.policy_gpus=1", "grid.rollout_gpus=1"]
    )
    plan = plan_placement(config)
    assert [(g.roles, g.gpus) for g in plan.groups] == [
        (("policy",), 1), (("rollout",), 1), (("reference",), 1), (("critic",), 1),
    ]
    assert not plan.offload_active  # nothing shares a device
    assert placement_problems(plan, config) == []


def test_colocated_offload_false_keeps_both_resident():
    plan = plan_placement(load_config(PUBLIC_PROFILE, ["rl.colocated_offload=false"]))
    assert plan.mode == "colocated" and not plan.offload_active


def test_cpu_plan_places_every_role_as_a_plain_zero_cpu_actor():
    plan = plan_placement(load_config(TINY_PROFILE))
    assert not plan.uses_gpus and not plan.offload_active
    lowered = LoweredPlacement(plan, {})
    for role in ("data", "rollout", "reward", "replay", "reference", "critic", "policy"):
        assert lowered.actor_options(role) == {"num_cpus": 0}


def test_tensor_parallel_engines_divide_the_rollout_group():
    config = load_config(PUBLIC_PROFILE, ["grid.rollout_tensor_parallel_size=2"])
    plan = plan_placement(config)
    assert plan.ranks("rollout") == 1 and placement_problems(plan, config) == []


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["grid.backend=local"], "grid.backend"),
        (["grid.gpus_per_node=3"], "grid.gpus_per_node"),
        (["grid.policy_gpus=0"], "grid.policy_gpus"),
        (["grid.rollout_gpus=2"], "grid.rollout_gpus"),
        (["grid.rollout_tensor_parallel_size=8", "grid.gpus_per_node=4"], "grid.rollout_tensor_parallel_size"),
    ],
)
def test_placement_problems_name_their_key(overrides, key):
    config = load_config(PUBLIC_PROFILE, overrides)
    assert key in [k for k, _ in placement_problems(plan_placement(config), config)]


def test_two_nodes_fit_what_one_node_cannot():
    config = load_config(PUBLIC_PROFILE, ["grid.gpus_per_node=2", "grid.num_nodes=2"])
    assert placement_problems(plan_placement(config), config) == []


def test_planning_imports_no_ray():
    import subprocess

    code = (
        "import sys\n"
        "from configs.loading import load_config\n"
        "from placement.plan import plan_placement, placement_problems\n"
        f"c = load_config({PUBLIC_PROFILE!r})\n"
        "placement_problems(plan_placement(c), c)\n"
        "print('ray' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_a_cpu_run_takes_its_trainer_ranks_from_cpu_trainer_ranks():
    config = load_config(TINY_PROFILE, ["grid.cpu_trainer_ranks=2"])
    plan = plan_placement(config)
    assert (plan.ranks("policy"), plan.ranks("critic"), plan.ranks("rollout"), plan.ranks("reference")) == (2, 2, 1, 1)
    assert placement_problems(plan, config) == []
    engines = plan_placement(load_config(TINY_PROFILE, ["grid.cpu_rollout_engines=2"]))
    assert (engines.ranks("rollout"), engines.ranks("policy")) == (2, 1)


def test_the_public_profile_runs_one_engine_per_policy_gpu_beside_its_rank():
    lowered = LoweredPlacement(plan_placement(load_config(PUBLIC_PROFILE)), {"actor": object()})
    for rank in range(2):
        # Colocated: engine i and policy rank i take half of bundle i each.
        rollout = lowered.actor_options("rollout", rank)
        policy = lowered.actor_options("policy", rank)
        assert rollout["num_gpus"] == policy["num_gpus"] == 0.5
        assert (
            rollout["scheduling_strategy"].placement_group_bundle_index
            == policy["scheduling_strategy"].placement_group_bundle_index
            == rank
        )


@pytest.mark.parametrize(
    "profile, overrides, message",
    [
        # Minibatch 8 cannot be cut into 3 equal rank shards.
        (
            TINY_PROFILE,
            ["grid.cpu_trainer_ranks=3", "rl.minibatch_size=8", "rl.micro_batch_size=4"],
            "not divisible by the 3 data-parallel ranks",
        ),
        # Every trainer has GPUs: host ranks would be silently ignored.
        (PUBLIC_PROFILE, ["grid.cpu_trainer_ranks=2"], "applies only to a trainer whose group has no GPU"),
        # A batch of 16 does not split over 3 engines.
        (
            TINY_PROFILE,
            ["grid.cpu_rollout_engines=3", "rl.batch_size=16", "rl.minibatch_size=8", "rl.micro_batch_size=8"],
            "not divisible by the 3 rollout engines",
        ),
        (PUBLIC_PROFILE, ["grid.cpu_rollout_engines=2"], "it applies only on the host"),
        # The public profile's reference has a GPU: host reference ranks would be ignored.
        (PUBLIC_PROFILE, ["grid.cpu_reference_ranks=2"], "the reference has GPUs (grid.reference_gpus=1"),
    ],
)
def test_rank_layouts_that_cannot_work_are_refused(profile, overrides, message):
    config = load_config(profile, overrides)
    problems = placement_problems(plan_placement(config), config)
    assert any(message in text for _, text in problems), problems


def test_on_a_cluster_a_one_node_plan_pins_every_role_to_the_chosen_node():
    """S-TEAM-2: a role asking for no CPU would otherwise be free to land on the
    flow's own zero-capacity node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    plan = plan_placement(load_config(TINY_PROFILE))
    lowered = LoweredPlacement(plan, {}, host_node="cd" * 28)
    for role in ("data", "rollout", "reward", "replay", "reference", "critic", "policy"):
        options = lowered.actor_options(role)
        assert options["num_cpus"] == 0 and isinstance(options["scheduling_strategy"], NodeAffinitySchedulingStrategy)
        assert options["scheduling_strategy"].node_id == "cd" * 28 and options["scheduling_strategy"].soft is False
