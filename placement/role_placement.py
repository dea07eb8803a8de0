"""What the plan tells each rank of each role, decided once per run (S-RUN-4).

The actor starter and the in-process builder both hand every role its
`RolePlacement` from `role_placements(plan)`, so no role re-plans from the whole
config and the two ways of running a role cannot disagree about where it lives.
Imports neither Ray nor torch at module level, like `placement.plan`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from placement.plan import RANKED_ROLES, PlacementPlan

SHARING_ROLES = ("policy", "rollout")
"""S-RUN-4: the two roles of the colocated group; under offload the trainer parks its
state on the host and the engine sleeps. Reference and critic own their devices."""


@dataclass(frozen=True)
class RolePlacement:
    """One rank of one role, as the plan placed it."""

    device: str  # "cuda" when the role's device group has GPUs, otherwise "cpu"
    parks: bool  # S-RUN-4: gives the shared GPU back between its calls (policy parks, engine sleeps)
    rank: int = 0
    ranks: int = 1

    def on_visible_device(self) -> RolePlacement:
        """This placement inside the process the role runs in. Only that process can
        tell whether its group's GPU is really there (Ray sets CUDA_VISIBLE_DEVICES per
        actor, so the first visible device is the bundle's GPU); without one the role
        computes on the host, where parking frees nothing."""
        if self.device == "cpu":
            return self
        import torch

        if torch.cuda.is_available():
            return self
        return dataclasses.replace(self, device="cpu", parks=False)


def role_placements(plan: PlacementPlan) -> dict[str, tuple[RolePlacement, ...]]:
    """Every rank of every role the run starts, rank 0 first: one placement per rank of
    the role's group (`RANKED_ROLES`, the frozen reference included); a role in no
    device group (data, replay, a reward role that loads no model) one host placement."""
    placements: dict[str, tuple[RolePlacement, ...]] = {}
    for role in plan.started_roles:
        group = plan.group_of(role)
        device = "cuda" if group is not None and group.gpus else "cpu"
        parks = role in SHARING_ROLES and plan.offload_active and device != "cpu"
        ranks = plan.ranks(role) if role in RANKED_ROLES else 1
        placements[role] = tuple(RolePlacement(device, parks, rank, ranks) for rank in range(ranks))
    return placements
