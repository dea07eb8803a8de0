"""Device groups: which roles share which GPUs, and how many ranks each runs (S-RUN-4, S-RUN-5).

Pure on purpose (no Ray, no torch): `--validate-manifest` checks a GPU launch on a
laptop with the very plan that will place it (S-RUN-3); `placement.ray_lowering` then
asks Ray for the resources. docs/architecture.md "Where roles run" describes the groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from configs.estimator_traits import uses_critic
from configs.schema import PPOConfig

TRAINER_ROLES = ("policy", "critic")
"""Roles that train, and so may run as several data-parallel ranks (S-FLOW-5)."""

SHARDED_ROLES = (*TRAINER_ROLES, "reference")
"""Roles whose model is sharded with FSDP2 over their ranks, one process group each
(S-SCALE-1): the two trainers and the frozen reference."""

RANKED_ROLES = (*SHARDED_ROLES, "rollout")
"""Roles that may run as several actors: the sharded roles' ranks (one process group
each) and the rollout's engines (independent, one shard each)."""

DEVICE_ROLES = ("policy", "rollout", "reference", "critic")
"""Roles that hold a model on a device whenever they run."""

HOST_ROLES = ("data", "reward", "replay")
"""Roles that hold no model of their own. One rule places every role: a role in one of
the plan's device groups computes there (the reward role joins one when it loads a
reward model, `_with_reward_model`); a role in none has a host placement."""


@dataclass(frozen=True)
class DeviceGroup:
    """GPUs shared by one or more roles; `gpus == 0` means the roles run on CPU."""

    name: str
    roles: tuple[str, ...]
    gpus: int
    key: str  # the config key that declares `gpus`, for error messages

    @property
    def fraction_per_role(self) -> float:
        """Share of each GPU bundle a role's actor asks for: colocated roles split it
        so Ray schedules them onto the same device."""
        return 1.0 / len(self.roles)


@dataclass(frozen=True)
class PlacementPlan:
    mode: str  # "colocated" | "disaggregated"
    groups: tuple[DeviceGroup, ...]
    gpus_per_node: int
    num_nodes: int
    rollout_tensor_parallel_size: int
    colocated_offload: bool
    cpu_trainer_ranks: int = 1
    cpu_rollout_engines: int = 1
    cpu_reference_ranks: int = 1

    @property
    def uses_gpus(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def total_gpus(self) -> int:
        return sum(group.gpus for group in self.groups)

    @property
    def available_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def offload_active(self) -> bool:
        """S-RUN-4: parking and sleeping only make sense when policy and rollout
        really share a device."""
        return self.mode == "colocated" and self.uses_gpus and self.colocated_offload

    @property
    def spreads_over_nodes(self) -> bool:
        """More than one node: every device group is then reserved as a placement group
        (CPU bundles on a CPU run) and pinned to the nodes `placement.node_layout`
        gives it, so where a role lands is the plan's choice, not the scheduler's."""
        return self.num_nodes > 1

    def reserved_groups(self) -> tuple[DeviceGroup, ...]:
        """Groups lowered onto placement groups: those with GPUs, and on a multi-node
        CPU run every group (a 0-GPU group of a GPU run stays on the host, unreserved)."""
        if self.uses_gpus:
            return tuple(group for group in self.groups if group.gpus)
        return self.groups if self.spreads_over_nodes else ()

    def bundles(self, group: DeviceGroup) -> int:
        """Bundles a reserved group holds: one per GPU; on the host one CPU per rank of
        its biggest role (colocated, engine i shares bundle i with policy rank i)."""
        if group.gpus:
            return group.gpus
        return max(self.ranks(role) if role in RANKED_ROLES else 1 for role in group.roles)

    def group_of(self, role: str) -> DeviceGroup | None:
        for group in self.groups:
            if role in group.roles:
                return group
        return None

    def ranks(self, role: str) -> int:
        """Data-parallel ranks a role's group provides: one per GPU (one engine per
        `grid.rollout_tensor_parallel_size` GPUs for the rollout); on the host, a trainer
        takes `grid.cpu_trainer_ranks`, the reference `grid.cpu_reference_ranks` and the
        rollout `grid.cpu_rollout_engines`."""
        group = self.group_of(role)
        if group is None or role not in RANKED_ROLES:  # one actor for every other role
            return 1
        if group.gpus == 0:
            if role == "rollout":
                return self.cpu_rollout_engines
            if role == "reference":
                return self.cpu_reference_ranks
            return self.cpu_trainer_ranks if role in TRAINER_ROLES else 1
        if role == "rollout":
            return max(1, group.gpus // self.rollout_tensor_parallel_size)
        return group.gpus

    @property
    def device_roles(self) -> tuple[str, ...]:
        """The device roles this run starts: every one with a group (a critic-free
        estimator's plan has no critic group, S-OPT-2)."""
        return tuple(role for role in DEVICE_ROLES if self.group_of(role) is not None)

    @property
    def started_roles(self) -> tuple[str, ...]:
        """Every role this run starts: its device roles and the host roles."""
        return (*self.device_roles, *HOST_ROLES)

    @property
    def trainer_roles(self) -> tuple[str, ...]:
        """The roles that train in this run: the policy, and the critic where the
        estimator uses one."""
        return tuple(role for role in TRAINER_ROLES if self.group_of(role) is not None)

    def describe(self) -> str:
        parts = []
        for group in self.groups:
            device = f"{group.gpus} GPU" + ("s" if group.gpus != 1 else "") if group.gpus else "CPU"
            parts.append(f"{'+'.join(group.roles)}: {device}")
        return f"{self.mode} [{'; '.join(parts)}]"


def plan_placement(config: PPOConfig) -> PlacementPlan:
    grid = config.grid
    if grid.gpu_placement == "colocated":
        groups = (
            DeviceGroup("actor", ("policy", "rollout"), grid.policy_gpus, "grid.policy_gpus"),
            DeviceGroup("reference", ("reference",), grid.reference_gpus, "grid.reference_gpus"),
            DeviceGroup("critic", ("critic",), grid.critic_gpus, "grid.critic_gpus"),
        )
    else:
        groups = (
            DeviceGroup("policy", ("policy",), grid.policy_gpus, "grid.policy_gpus"),
            DeviceGroup("rollout", ("rollout",), grid.rollout_gpus, "grid.rollout_gpus"),
            DeviceGroup("reference", ("reference",), grid.reference_gpus, "grid.reference_gpus"),
            DeviceGroup("critic", ("critic",), grid.critic_gpus, "grid.critic_gpus"),
        )
    if not uses_critic(config.rl.advantage_estimator):  # S-OPT-2: no critic to place
        groups = tuple(group for group in groups if group.roles != ("critic",))
    groups = _with_reward_model(config, groups)
    return PlacementPlan(
        mode=grid.gpu_placement,
        groups=groups,
        gpus_per_node=grid.gpus_per_node,
        num_nodes=grid.num_nodes,
        rollout_tensor_parallel_size=grid.rollout_tensor_parallel_size,
        colocated_offload=config.rl.colocated_offload,
        cpu_trainer_ranks=grid.cpu_trainer_ranks,
        cpu_rollout_engines=grid.cpu_rollout_engines,
        cpu_reference_ranks=grid.cpu_reference_ranks,
    )


def loads_reward_model(config: PPOConfig) -> bool:
    """A reward model loaded in the reward role's actor (not only served): it needs a device."""
    model = config.rl.reward.model
    return model is not None and model.url is None


def _with_reward_model(config: PPOConfig, groups: tuple[DeviceGroup, ...]) -> tuple[DeviceGroup, ...]:
    """S-RM-1: the reward role joins the frozen reference's group, or gets its own; without a
    loaded reward model the plan is exactly as before (the reward role stays a host role)."""
    if not loads_reward_model(config):
        return groups
    if config.grid.reward_placement == "own":
        return (*groups, DeviceGroup("reward", ("reward",), config.grid.reward_gpus, "grid.reward_gpus"))
    return tuple(
        DeviceGroup(g.name, (*g.roles, "reward"), g.gpus, g.key) if "reference" in g.roles else g for g in groups
    )


def placement_problems(plan: PlacementPlan, config: PPOConfig) -> list[tuple[str, str]]:
    """Every way the declared groups cannot be placed on the declared devices, as
    (key, message) pairs. Checks only what the config says: the machine running the
    check may have no GPU at all (S-RUN-3)."""
    return [*_declared_problems(plan, config), *_shard_problems(plan, config), *_device_problems(plan)]


def _declared_problems(plan: PlacementPlan, config: PPOConfig) -> list[tuple[str, str]]:
    """Grid keys that contradict the placement the others declare."""
    problems: list[tuple[str, str]] = []
    grid = config.grid
    if grid.reward_gpus and (grid.reward_placement != "own" or not loads_reward_model(config)):
        why = ("grid.reward_placement is with_reference (it shares the reference's GPUs)"
               if loads_reward_model(config) else "no reward model is loaded (rl.reward.model.path without url)")
        problems.append(("grid.reward_gpus", f"is {grid.reward_gpus} but {why}; set grid.reward_gpus=0"))
    if config.grid.backend != "ray":
        problems.append(
            ("grid.backend", f"{grid.backend!r} is not supported: PPO runs each role as its own Ray actor "
             "group; use grid.backend=ray")
        )
    if plan.mode == "colocated" and grid.rollout_gpus:
        problems.append(
            ("grid.rollout_gpus", f"is {grid.rollout_gpus} but grid.gpu_placement=colocated puts the rollout on the "
             "policy's GPUs (grid.policy_gpus); set grid.rollout_gpus=0, or grid.gpu_placement=disaggregated")
        )
    if grid.cpu_trainer_ranks > 1 and all(plan.group_of(role).gpus for role in plan.trainer_roles):  # type: ignore[union-attr]
        problems.append(
            ("grid.cpu_trainer_ranks", f"is {grid.cpu_trainer_ranks} but every trainer has GPUs (one rank per GPU); "
             "it applies only to a trainer whose group has no GPU")
        )
    reference_group = plan.group_of("reference")
    if grid.cpu_reference_ranks > 1 and reference_group is not None and reference_group.gpus:
        problems.append(
            ("grid.cpu_reference_ranks", f"is {grid.cpu_reference_ranks} but the reference has GPUs "
             f"({reference_group.key}={reference_group.gpus}: one rank per GPU); it applies only on the host")
        )
    rollout_group = plan.group_of("rollout")
    assert rollout_group is not None  # both placements give the rollout a group
    if grid.cpu_rollout_engines > 1 and rollout_group.gpus:
        problems.append(
            ("grid.cpu_rollout_engines", f"is {grid.cpu_rollout_engines} but the rollout has GPUs ({rollout_group.key}="
             f"{rollout_group.gpus}: one engine per grid.rollout_tensor_parallel_size GPUs); "
             "it applies only on the host")
        )
    return problems


def _shard_problems(plan: PlacementPlan, config: PPOConfig) -> list[tuple[str, str]]:
    """Batches the engines and the data-parallel ranks cannot share out equally."""
    problems: list[tuple[str, str]] = []
    rollout_group = plan.group_of("rollout")
    assert rollout_group is not None  # both placements give the rollout a group
    engines = plan.ranks("rollout")
    # Prompts, not samples, are dealt to the engines: a prompt's samples stay on one (S-OPT-2).
    if engines > 1 and config.rl.batch_size % engines:
        key = rollout_group.key if rollout_group.gpus else "grid.cpu_rollout_engines"
        n = config.rl.rollout.samples_per_prompt
        whole = "" if n == 1 else (
            f" of whole prompts, each prompt's rl.rollout.samples_per_prompt={n} samples on one engine"
        )
        problems.append(
            ("rl.batch_size", f"is {config.rl.batch_size}, not divisible by the {engines} rollout engines ({key}); "
             f"every engine generates an equal shard{whole}")
        )
    for role in plan.trainer_roles:
        ranks = plan.ranks(role)
        group = plan.group_of(role)
        key = group.key if group is not None and group.gpus else "grid.cpu_trainer_ranks"
        if ranks > 1 and config.rl.minibatch_size % ranks:
            problems.append(
                ("rl.minibatch_size", f"is {config.rl.minibatch_size}, not divisible by the {ranks} data-parallel "
                 f"ranks of the {role} ({key}={ranks}); every rank needs an equal shard")
            )
    return problems


def _device_problems(plan: PlacementPlan) -> list[tuple[str, str]]:
    """GPUs declared against the GPUs the nodes have."""
    problems: list[tuple[str, str]] = []
    tp = plan.rollout_tensor_parallel_size
    rollout_group = plan.group_of("rollout")
    assert rollout_group is not None
    if not plan.uses_gpus:
        for group in plan.groups:
            if group.gpus:
                problems.append(
                    (group.key, f"declares {group.gpus} GPU(s) but grid.gpus_per_node=0 (a CPU run); "
                     f"set grid.gpus_per_node, or {group.key}=0")
                )
        if tp != 1:
            problems.append(("grid.rollout_tensor_parallel_size", f"is {tp} on a CPU run (grid.gpus_per_node=0); "
                             "tensor parallelism needs GPUs"))
        return problems
    for group in plan.groups:
        if group.gpus == 0 and {"policy", "rollout"} & set(group.roles):
            # Reference and critic may stay on the host in a GPU run (a one-GPU
            # workstation); the trainer and the engine may not.
            problems.append(
                (group.key, f"is 0 but grid.gpus_per_node={plan.gpus_per_node}: the {'+'.join(group.roles)} group "
                 f"of a GPU run needs at least one GPU ({plan.mode} placement)")
            )
    if plan.total_gpus > plan.available_gpus:
        wanted = " + ".join(f"{g.key}={g.gpus}" for g in plan.groups)
        problems.append(
            ("grid.gpus_per_node", f"too few GPUs for the {plan.mode} placement: the device groups need {wanted} = "
             f"{plan.total_gpus} GPUs, but grid.gpus_per_node={plan.gpus_per_node} x grid.num_nodes={plan.num_nodes} "
             f"= {plan.available_gpus}")
        )
    if tp > plan.gpus_per_node:
        problems.append(
            ("grid.rollout_tensor_parallel_size", f"is {tp} but one node has only "
             f"grid.gpus_per_node={plan.gpus_per_node} GPUs; a tensor-parallel engine must fit on one node")
        )
    if rollout_group.gpus and rollout_group.gpus % tp:
        problems.append(
            ("grid.rollout_tensor_parallel_size", f"is {tp}, which does not divide the rollout's "
             f"{rollout_group.gpus} GPUs ({rollout_group.key}); each engine takes {tp} GPUs")
        )
    return problems
