"""The engine's side of a weight version (S-SCALE-3, S-XFER-1): refuse a publication
that misses or repeats a weight, or whose NIXL buckets carry another version, before
any bucket is read; then hand the buckets over one at a time. The same for an engine
that has served since the start and for one started in the middle of a run."""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from weights.nixl_transport import WeightTransferError
from weights.publication import WeightPublication


def receive(
    published: WeightPublication, policy_version: int, receiver: str, expected: Sequence[str] | None,
    timeout_s: float | None, loopback: bool, owned: bool = True,
) -> Iterator[dict[str, torch.Tensor]]:
    """`published`'s buckets for `receiver` (an engine named in errors) as
    `policy_version`; over NIXL a stalled read fails within `timeout_s`."""
    published.check_covers(expected, receiver)
    if published.transport == "nixl":  # every bucket's header is checked against this version
        stale = [bucket.version for bucket in published.stored if bucket.version != policy_version]
        if stale:
            raise WeightTransferError(
                f"weight sync over nixl: {receiver} was handed buckets of policy_version {stale[0]} "
                f"as policy_version {policy_version}"
            )
    return published.fetch(receiver, timeout_s=timeout_s, loopback=loopback, owned=owned)
