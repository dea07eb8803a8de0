"""Which node slot each bundle of each reserved device group goes to (S-RUN-4), decided
from the plan alone: pure, like `placement.plan`, so a launch and its manifest agree.

Slots are numbered 0..grid.num_nodes-1; `placement.ray_lowering` maps them onto the
cluster's nodes. A group is kept on one node when it fits (a trainer's collectives
and a colocated pair stay within a node); the least loaded node that has room takes
it, so the groups of a run spread over the nodes. A group bigger than any node's room
is spilled bundle by bundle (a trainer that spans nodes)."""

from __future__ import annotations

from placement.plan import PlacementPlan


def node_slots(plan: PlacementPlan) -> dict[str, tuple[int, ...]]:
    """Group name -> the node slot of each of its bundles, for every reserved group.
    On one node every bundle is in slot 0."""
    capacity = plan.gpus_per_node if plan.uses_gpus else None  # a node's CPUs are not declared
    load = [0] * plan.num_nodes
    slots: dict[str, tuple[int, ...]] = {}
    for group in plan.reserved_groups():
        count = plan.bundles(group)
        whole = [node for node in range(plan.num_nodes) if capacity is None or load[node] + count <= capacity]
        if whole:
            node = min(whole, key=lambda n: (load[n], n))
            load[node] += count
            slots[group.name] = (node,) * count
            continue
        spilled: list[int] = []
        for _ in range(count):  # only GPUs get here: a node's room is declared
            free = [n for n in range(plan.num_nodes) if load[n] < (capacity or 0)] or list(range(plan.num_nodes))
            node = min(free, key=lambda n: (n not in spilled[-1:], load[n], n))  # beside the previous bundle
            load[node] += 1
            spilled.append(node)
        slots[group.name] = tuple(spilled)
    return slots


def host_slot(plan: PlacementPlan) -> int:
    """The node slot of the host roles (data, reward, replay): beside the first reserved
    group's first bundle, the rollout's (it reads their prompts; reward reads its output)."""
    slots = node_slots(plan)
    return next(iter(slots.values()))[0] if slots else 0


def describe_slots(plan: PlacementPlan) -> str:
    """`slot 0: policy+rollout (2 bundles), critic, data, reward, replay; slot 1: reference`, for the manifest."""
    by_slot: dict[int, list[str]] = {slot: [] for slot in range(plan.num_nodes)}
    groups = {group.name: group for group in plan.groups}
    for name, slots in node_slots(plan).items():
        for slot in sorted(set(slots)):
            count = slots.count(slot)
            by_slot[slot].append("+".join(groups[name].roles) + (f" ({count} bundles)" if count > 1 else ""))
    by_slot[host_slot(plan)].append("data, reward, replay")
    return "; ".join(f"slot {slot}: {', '.join(names) or 'nothing'}" for slot, names in by_slot.items())
