"""Each model role's DeviceMesh, decided from the placement plan (S-SCALE-1).

A trainer's ranks shard its weights, gradients and optimizer state (FSDP2); the
frozen reference's ranks shard its weights alone. Within a
node the shard group is every rank of the role; a group larger than one node shards
within each node and replicates across nodes (HSDP), so it must take whole nodes.
Pure, without torch: `--validate-manifest` prints and checks these meshes on a
laptop (S-RUN-3), and the trainer builds its mesh from the very same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from placement.plan import SHARDED_ROLES, TRAINER_ROLES, PlacementPlan


@dataclass(frozen=True)
class RoleMesh:
    role: str
    ranks: int
    shard: int  # ranks that each hold 1/shard of the state
    replicas: int  # copies of the sharded state (nodes, under HSDP)
    device: str  # "cuda" | "cpu"

    @property
    def sharded(self) -> bool:
        return self.shard > 1

    def describe(self) -> str:
        if not self.sharded and self.replicas == 1:
            return f"{self.role}: 1 rank on {self.device}, unsharded"
        backend = "nccl" if self.device == "cuda" else "gloo"
        kind = "HSDP" if self.replicas > 1 else "FSDP2"
        state = "weights, gradients, optimizer state" if self.role in TRAINER_ROLES else "weights (frozen)"
        return (
            f"{self.role}: {self.ranks} ranks on {self.device} ({backend}), {kind} shard {self.shard} "
            f"(each rank holds 1/{self.shard} of {state}) x {self.replicas} "
            f"replica{'s' if self.replicas != 1 else ''}"
        )


def role_mesh(plan: PlacementPlan, role: str) -> RoleMesh:
    group = plan.group_of(role)
    on_gpu = plan.uses_gpus and group is not None and group.gpus > 0
    ranks = plan.ranks(role) if role in SHARDED_ROLES else 1
    shard = min(ranks, plan.gpus_per_node) if on_gpu else ranks
    return RoleMesh(role, ranks, shard, max(1, ranks // shard), "cuda" if on_gpu else "cpu")


def role_meshes(plan: PlacementPlan) -> dict[str, RoleMesh]:
    """Every model role's mesh; the rollout's engines are independent, not a mesh."""
    return {role: role_mesh(plan, role) for role in plan.device_roles if role != "rollout"}


def mesh_problems(plan: PlacementPlan) -> list[tuple[str, str]]:
    """(key, message) for every sharded role's mesh the declared devices cannot hold."""
    problems = []
    for role in SHARDED_ROLES:
        mesh = role_mesh(plan, role)
        group = plan.group_of(role)
        if mesh.device == "cuda" and group is not None and mesh.ranks % mesh.shard:
            problems.append((
                group.key,
                f"is {group.gpus}: the {role} spans nodes of grid.gpus_per_node={plan.gpus_per_node} GPUs, so it "
                f"shards within a node and replicates across nodes (HSDP), which needs a whole number of nodes; "
                f"use a multiple of {plan.gpus_per_node}",
            ))
    return problems
