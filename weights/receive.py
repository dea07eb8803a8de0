"""The engine's side of a weight version (S-SCALE-3, S-XFER-1): refuse a publication
that misses or repeats a weight, or whose NIXL buckets carry another version, before
any bucket is read; then hand the buckets over one at a time. The same for an engine
that has served since the start and for one started in the middle of a run."""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from weights.publication import WeightPublication
from weights.transport import transport_named


def receive(
    published: WeightPublication, policy_version: int, receiver: str, expected: Sequence[str] | None,
    timeout_s: float | None, loopback: bool, owned: bool = True,
) -> Iterator[dict[str, torch.Tensor]]:
    """`published`'s buckets for `receiver` (an engine named in errors) as
    `policy_version`; over NIXL a stalled read fails within `timeout_s`."""
    published.check_covers(expected, receiver)
    transport_named(published.transport, loopback).check_version(published.stored, policy_version, receiver)
    return published.fetch(receiver, timeout_s=timeout_s, loopback=loopback, owned=owned)
