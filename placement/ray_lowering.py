"""A placement plan lowered onto Ray resources (S-RUN-4, S-RUN-5): one placement group
per reserved device group (GPU bundles on a GPU run, CPU bundles on a multi-node CPU
run), nothing at all on a one-node CPU run (every role is then a plain `num_cpus=0`
actor). On more than one node each bundle is pinned, by Ray's node-id label, to the
node `placement.node_layout` chose, and the host roles to the node beside the rollout.
On a cluster a one-node plan is pinned too (S-TEAM-2): an actor that asks for no CPU
may otherwise land on the flow's own node, which joins with none and dies with the flow.
Kept apart from `placement.plan`, which must not import Ray: the manifest checks a plan
on a machine that may never start Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from placement.node_layout import host_slot, node_slots
from placement.plan import PlacementPlan

if TYPE_CHECKING:  # Ray is imported only when a plan is lowered
    from ray.util.placement_group import PlacementGroup

NODE_ID_LABEL = "ray.io/node-id"  # every Ray node carries it; a bundle label selector pins to one node


class PlacementError(RuntimeError):
    pass


@dataclass
class LoweredPlacement:
    """The Ray resources a plan became; `actor_options` is what `.options()` takes."""

    plan: PlacementPlan
    placement_groups: dict[str, "PlacementGroup"]
    host_node: str | None = None  # on a cluster: the node id the unreserved roles are pinned to

    def actor_options(self, role: str, rank: int = 0) -> dict[str, Any]:
        group = self.plan.group_of(role)
        if group is None or group.name not in self.placement_groups:  # a host role (data, replay, reward)
            if self.host_node is None:
                # One node: no reservation at all. Actors that ask for a CPU each would
                # not fit seven roles on a 2-core machine; with num_cpus=0 they share the cores.
                return {"num_cpus": 0}
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(self.host_node, soft=False)}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = rank * self.plan.rollout_tensor_parallel_size if role == "rollout" else rank
        if bundle >= self.plan.bundles(group):
            raise PlacementError(
                f"{role} rank {rank} has no bundle in device group {group.name!r} ({group.key}={group.gpus})"
            )
        # Colocated roles split each bundle, so Ray puts both on its GPU (or CPU).
        share = {"num_gpus": group.fraction_per_role} if group.gpus else {"num_cpus": group.fraction_per_role}
        return {
            "num_cpus": 0,
            **share,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.placement_groups[group.name],
                placement_group_bundle_index=bundle,
                placement_group_capture_child_tasks=True,  # vLLM's own workers stay inside the group
            ),
        }


def lower_placement(plan: PlacementPlan, *, namespace: str, ready_timeout_s: float = 120.0) -> LoweredPlacement:
    """Reserve one placement group per reserved device group, or nothing (one-node CPU runs).

    Refuses before any actor starts when the connected cluster has fewer GPUs or
    nodes than the plan, naming the config keys, instead of waiting forever on a
    pending group.
    """
    reserved = plan.reserved_groups()
    if not reserved:
        return LoweredPlacement(plan, {}, host_node=roomiest_node(plan))
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    cluster_gpus = int(ray.cluster_resources().get("GPU", 0))
    if plan.uses_gpus and cluster_gpus < plan.total_gpus:
        wanted = ", ".join(f"{g.key}={g.gpus}" for g in plan.groups)
        raise PlacementError(
            f"the Ray cluster has {cluster_gpus} GPU(s) but the {plan.mode} placement needs "
            f"{plan.total_gpus} ({wanted}); join a bigger cluster (RAY_ADDRESS / grid.ray_address) "
            "or lower the group sizes"
        )
    slots = node_slots(plan)
    nodes = cluster_nodes(plan, slots) if plan.spreads_over_nodes else None
    groups: dict[str, PlacementGroup] = {}
    for group in reserved:
        resource = "GPU" if group.gpus else "CPU"
        pinned = {} if nodes is None else {
            "bundle_label_selector": [{NODE_ID_LABEL: nodes[slot]} for slot in slots[group.name]]
        }
        # PACK: on one node, a group's bundles share a node when they can (NCCL within a
        # node is fastest) and spill over nodes when they cannot.
        groups[group.name] = placement_group(
            [{resource: 1.0} for _ in range(plan.bundles(group))], strategy="PACK",
            name=f"{namespace}-{group.name}", **pinned,
        )
    ready = [pg.ready() for pg in groups.values()]
    _, pending = ray.wait(ready, num_returns=len(ready), timeout=ready_timeout_s)
    if pending:
        stuck = [name for name, pg in groups.items() if not _is_ready(pg)]
        for pg in groups.values():
            remove_placement_group(pg)
        raise PlacementError(
            f"device groups {', '.join(stuck)} could not be placed within {ready_timeout_s:.0f} s "
            f"(the cluster has {cluster_gpus} GPUs in all; a group may need more GPUs on one node than any node has, "
            "or a node's resources are held by another job)"
        )
    if nodes is not None:
        host_node = nodes[host_slot(plan)]
    else:  # one node: beside the rollout's first bundle, where the group was placed
        host_node = _node_of_first_bundle(groups[reserved[0].name]) if len(_alive_nodes()) > 1 else None
    return LoweredPlacement(plan, groups, host_node=host_node)


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [node for node in ray.nodes() if node.get("Alive")]


def roomiest_node(plan: PlacementPlan) -> str | None:
    """S-TEAM-2: on a cluster of several nodes, the node a one-node plan without
    reservations runs on: the one with the most of the plan's resource, then by id so
    a rerun picks the same node. None on a Ray of one node (the run's own local Ray:
    nothing else to choose, and no node there runs without CPUs). A cluster whose
    nodes have none of it (only zero-capacity nodes, such as the flow's) is refused."""
    alive = _alive_nodes()
    if len(alive) <= 1:
        return None
    resource = "GPU" if plan.uses_gpus else "CPU"
    able = sorted(
        (node for node in alive if node["Resources"].get(resource, 0) > 0),
        key=lambda node: (-node["Resources"][resource], node["NodeID"]),
    )
    if not able:
        raise PlacementError(
            f"the Ray cluster has {len(alive)} alive node(s) but none with {resource}s (the flow's own node joins "
            f"with none); add a node with {resource}s (ray start --address=... --num-cpus=N)"
        )
    return able[0]["NodeID"]


def _node_of_first_bundle(group: "PlacementGroup") -> str:
    from ray.util import placement_group_table

    return placement_group_table(group)["bundles_to_node_id"][0]


def cluster_nodes(plan: PlacementPlan, slots: dict[str, tuple[int, ...]]) -> list[str]:
    """The node id for each of the plan's `grid.num_nodes` slots: the alive nodes that
    have the bundles' resource (a head started with no CPUs and no GPUs takes no role),
    most of it first, then by id so a rerun picks the same nodes. Refuses a cluster
    with too few such nodes, or a node too small for the bundles of its slot."""
    import ray

    resource = "GPU" if plan.uses_gpus else "CPU"
    alive = [node for node in ray.nodes() if node.get("Alive") and node["Resources"].get(resource, 0) > 0]
    alive.sort(key=lambda node: (-node["Resources"][resource], node["NodeID"]))
    if len(alive) < plan.num_nodes:
        raise PlacementError(
            f"grid.num_nodes={plan.num_nodes} but the Ray cluster has {len(alive)} alive node(s) with {resource}s; "
            "add nodes (ray start --address=...) or lower grid.num_nodes"
        )
    chosen = alive[: plan.num_nodes]
    for slot, node in enumerate(chosen):
        needed = sum(group_slots.count(slot) for group_slots in slots.values())
        if needed > node["Resources"][resource]:
            raise PlacementError(
                f"node {node['NodeID'][:8]} ({node['NodeManagerAddress']}) has {node['Resources'][resource]:g} "
                f"{resource}(s) but the plan puts {needed} {resource} bundle(s) on it (grid.num_nodes="
                f"{plan.num_nodes}); give each node more {resource}s (ray start --num-cpus/--num-gpus) "
                "or raise grid.num_nodes"
            )
    return [node["NodeID"] for node in chosen]


def _is_ready(pg: "PlacementGroup") -> bool:
    import ray

    done, _ = ray.wait([pg.ready()], timeout=0)
    return bool(done)


def release_placement(lowered: LoweredPlacement | None) -> None:
    if lowered is None or not lowered.placement_groups:
        return
    from ray.util.placement_group import remove_placement_group

    for pg in lowered.placement_groups.values():
        try:
            remove_placement_group(pg)
        except Exception:  # already gone with its job: nothing to release
            pass
