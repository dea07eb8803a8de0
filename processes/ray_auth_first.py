"""Imported first by the `ppo` flow's module: a deployment's flow process (started by a
Prefect worker, not the command line) makes a local Ray's auth settings before anything
imports Ray, which reads them once. A process that names a cluster in RAY_ADDRESS keeps
the cluster's own settings; one whose profile or parameters name it only through
`grid.ray_address` is refused when it would join with the token made here (S-TEAM-2,
`processes.ray_session.require_cluster_token`): set RAY_ADDRESS and the cluster's token
in the worker's environment too (docs/launch.md)."""

import contextlib
import os

from processes.ray_session import RayAuthRefused, prepare_ray_auth

# A refused setting (RAY_AUTH_MODE=disabled) is named when the flow starts Ray, not here.
with contextlib.suppress(RayAuthRefused):
    prepare_ray_auth(joins_cluster=bool(os.environ.get("RAY_ADDRESS")))
