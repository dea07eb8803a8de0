"""A multi-node Ray cluster on this one machine (`ray.cluster_utils.Cluster`): a head
with no CPUs, so no role may land on it, and worker nodes with logical CPUs. Started
with the run's token authentication in this process's environment (S-SEC-1): the
cluster's processes inherit it, and so does every process the test starts to join it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

WORKER_CPUS = 2  # logical: the tiny colocated plan puts two 1-CPU bundles on its first node


@contextmanager
def head_and_workers(workers: int = 2) -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    from processes.ray_session import protect_local_ray

    protect_local_ray(os.environ)  # keeps a token already set (the session's local Ray uses it too)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(
        initialize_head=True, connect=False, head_node_args={"num_cpus": 0, "num_gpus": 0, "include_dashboard": False}
    )
    try:
        for _ in range(workers):
            cluster.add_node(num_cpus=WORKER_CPUS, num_gpus=0)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
