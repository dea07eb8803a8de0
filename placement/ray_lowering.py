"""A placement plan lowered onto Ray resources (S-RUN-4, S-RUN-5): one placement group
of GPU bundles per device group on a GPU run, nothing at all on CPU (every role is then
a plain `num_cpus=0` actor). Kept apart from `placement.plan`, which must not import
Ray: the manifest checks a plan on a machine that may never start Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from placement.plan import HOST_ROLES, PlacementPlan

if TYPE_CHECKING:  # Ray is imported only when a plan is lowered
    from ray.util.placement_group import PlacementGroup


class PlacementError(RuntimeError):
    pass


@dataclass
class LoweredPlacement:
    """The Ray resources a plan became; `actor_options` is what `.options()` takes."""

    plan: PlacementPlan
    placement_groups: dict[str, "PlacementGroup"]

    def actor_options(self, role: str, rank: int = 0) -> dict[str, Any]:
        group = self.plan.group_of(role)
        if group is None or group.gpus == 0 or role in HOST_ROLES:
            # CPU: no reservation at all. Actors that ask for a CPU each would not fit
            # seven roles on a 2-core machine; num_cpus=0 is measured to work here.
            return {"num_cpus": 0}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if role == "rollout":
            bundle = rank * self.plan.rollout_tensor_parallel_size
        else:
            bundle = rank
        if bundle >= group.gpus:
            raise PlacementError(
                f"{role} rank {rank} has no bundle in device group {group.name!r} ({group.key}={group.gpus})"
            )
        return {
            "num_cpus": 0,
            "num_gpus": group.fraction_per_role,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.placement_groups[group.name],
                placement_group_bundle_index=bundle,
                placement_group_capture_child_tasks=True,  # vLLM's own workers stay inside the group
            ),
        }


def lower_placement(plan: PlacementPlan, *, namespace: str, ready_timeout_s: float = 120.0) -> LoweredPlacement:
    """Reserve one placement group per device group (GPU runs), or nothing (CPU runs).

    Refuses before any actor starts when the connected cluster has fewer GPUs than
    the plan, naming the config keys, instead of waiting forever on a pending group.
    """
    if not plan.uses_gpus:
        return LoweredPlacement(plan, {})
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    cluster_gpus = int(ray.cluster_resources().get("GPU", 0))
    if cluster_gpus < plan.total_gpus:
        wanted = ", ".join(f"{g.key}={g.gpus}" for g in plan.groups)
        raise PlacementError(
            f"the Ray cluster has {cluster_gpus} GPU(s) but the {plan.mode} placement needs "
            f"{plan.total_gpus} ({wanted}); join a bigger cluster (RAY_ADDRESS / grid.ray_address) "
            "or lower the group sizes"
        )
    groups: dict[str, PlacementGroup] = {}
    for group in (g for g in plan.groups if g.gpus):  # a 0-GPU group runs on the host
        # PACK: a group's bundles share a node when they can (NCCL within a node is
        # fastest) and spill over nodes when they cannot.
        groups[group.name] = placement_group(
            [{"GPU": 1.0} for _ in range(group.gpus)], strategy="PACK", name=f"{namespace}-{group.name}"
        )
    ready = [pg.ready() for pg in groups.values()]
    _, pending = ray.wait(ready, num_returns=len(ready), timeout=ready_timeout_s)
    if pending:
        stuck = [name for name, pg in groups.items() if not _is_ready(pg)]
        for pg in groups.values():
            remove_placement_group(pg)
        raise PlacementError(
            f"device groups {', '.join(stuck)} could not be placed within {ready_timeout_s:.0f} s "
            f"(the cluster has {cluster_gpus} GPUs in all; a group may need more GPUs on one node than any node has)"
        )
    return LoweredPlacement(plan, groups)


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
