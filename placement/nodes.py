"""Where the run's actors are, as Ray sees it: asked once after start-up, so that when a
node is lost the failure can still name it and the roles it held (S-FAULT-1); a dead
actor can no longer say where it was."""

from __future__ import annotations

from typing import Any


def actor_whereabouts(actors: dict[str, Any], timeout_s: float = 30.0) -> dict[str, tuple[str, str]]:
    """Actor key -> (its Ray actor id, the id of the node its process runs on), asked of
    each actor itself (Ray's public runtime context, run inside it through
    compat/ray_compat.py). Best effort: an actor that does not answer in time, or any
    actor on a Ray that module was not written for, is left out, and its failures are
    then named without it."""
    import ray

    from compat.ray_compat import call_inside

    def whereabouts(_self: Any) -> tuple[str | None, str]:
        import ray

        from compat.ray_compat import current_actor

        return current_actor(), ray.get_runtime_context().get_node_id()

    asked = {ref: key for key in actors if (ref := call_inside(actors[key], whereabouts)) is not None}
    if not asked:
        return {}
    answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=timeout_s)
    found: dict[str, tuple[str, str]] = {}
    for ref in answered:
        try:
            found[asked[ref]] = ray.get(ref)
        except Exception:  # an actor already gone: its own stage will name it
            continue
    return found


def node_addresses() -> dict[str, tuple[str, bool]]:
    """Node id -> (IP address, alive) for every node the cluster has known (a dead node
    stays listed, not alive); empty when the cluster cannot be asked, so a failure is
    still named, without the node."""
    import ray

    try:
        return {node["NodeID"]: (node["NodeManagerAddress"], bool(node["Alive"])) for node in ray.nodes()}
    except Exception:  # the GCS itself is unreachable
        return {}


def is_lost(node_id: str, addresses: dict[str, tuple[str, bool]]) -> bool:
    """Only what the cluster says: a node it lists as not alive."""
    return node_id in addresses and not addresses[node_id][1]


def node_name(node_id: str, addresses: dict[str, tuple[str, bool]]) -> str:
    """A node as users read it: the id's start (what `ray status` and the dashboard
    show) and its address (several nodes may share one machine)."""
    address = addresses.get(node_id, ("unknown address", False))[0]
    return f"node {node_id[:8]} ({address})"


def describe_layout(labels_by_node: dict[str, list[str]]) -> str:
    """`node 1a2b3c4d (10.0.0.5): policy, rollout; node ...`, for the start-up log."""
    addresses = node_addresses()
    return "; ".join(f"{node_name(node, addresses)}: {', '.join(labels)}" for node, labels in labels_by_node.items())
