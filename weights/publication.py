"""One policy version's weights as a stream of bounded buckets (S-SCALE-3, S-FLOW-6).

Rank 0 puts each gathered bucket into the object store and drops it, so it holds its
shard and one bucket; it returns a small manifest of bucket references and the names
each carries, which lets a receiver refuse a publication (a weight missing, twice, or
unknown) before touching its model. In process the buckets are the dicts themselves.
With `rl.weight_sync_transport=nixl` a bucket is a NIXL descriptor instead
(weights/nixl_transport.py), in process too. docs/architecture.md "Data flow" follows
a version to the engines.
"""

from __future__ import annotations

from dataclasses import dataclass
import time
from typing import Any, Iterable, Iterator, Sequence

import torch

from weights.nixl_transport import NixlPeer
from weights.transport import transport_named


class WeightPublicationError(RuntimeError):
    pass


@dataclass(frozen=True)
class WeightPublication:
    names: tuple[tuple[str, ...], ...] = ()  # the weight names of each bucket, in gathering order
    sizes: tuple[int, ...] = ()  # bytes of each bucket
    stored: tuple[Any, ...] = ()  # each bucket: an ObjectRef (from a Ray actor), a NixlBucket, or the dict
    peer: NixlPeer | None = None  # the publishing NIXL agent, when the buckets are NixlBuckets

    @property
    def transport(self) -> str:
        return "nixl" if self.peer is not None else "object_store"

    @property
    def buckets(self) -> int:
        return len(self.names)

    @property
    def bytes(self) -> int:
        return sum(self.sizes)

    def check_covers(self, expected: Sequence[str] | None, receiver: str) -> None:
        """Refuse a publication in which a weight arrives twice, or (given the names the
        receiver's model holds) one of them never arrives or one arrives it has no
        place for; the message names the weight."""
        bucket_of: dict[str, int] = {}
        for index, names in enumerate(self.names):
            for name in names:
                if name in bucket_of:
                    raise WeightPublicationError(
                        f"{receiver} refuses the published weights: {name!r} arrives twice (buckets "
                        f"{bucket_of[name]} and {index} of {self.buckets}); every weight must arrive exactly once"
                    )
                bucket_of[name] = index
        if expected is None:
            return
        missing = [name for name in expected if name not in bucket_of]
        wanted = set(expected)
        unknown = [name for name in bucket_of if name not in wanted]
        if missing or unknown:
            problems = []
            if missing:
                problems.append(f"{len(missing)} weight(s) never arrive, first {missing[0]!r}")
            if unknown:
                problems.append(f"{len(unknown)} weight(s) its model does not have, first {unknown[0]!r}")
            raise WeightPublicationError(
                f"{receiver} refuses the published weights ({self.buckets} buckets): {'; '.join(problems)}"
            )

    def fetch(
        self, receiver: str = "the engine", timeout_s: float | None = None, loopback: bool = True,
        owned: bool = True,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Each bucket in turn, fetched only when the one before has been handed on;
        a bucket that does not hold the names the manifest gives it is refused. Over
        NIXL the whole fetch must end within `timeout_s`, and without `owned` a bucket's
        tensors are valid only until the next one is fetched."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else float("inf"))
        transport = transport_named(self.transport, loopback)
        for index, (names, stored) in enumerate(zip(self.names, self.stored)):
            bucket = transport.read(self.peer, stored, f"{receiver}, bucket {index} of {self.buckets}", deadline, owned)
            if set(bucket) != set(names):
                absent, extra = sorted(set(names) - set(bucket)), sorted(set(bucket) - set(names))
                raise WeightPublicationError(
                    f"published bucket {index} of {self.buckets} does not hold what its manifest names: "
                    f"missing {absent[:3]}, not named {extra[:3]}"
                )
            yield bucket
            del bucket  # held by the consumer alone from here: one bucket at a time


def publish(
    buckets: Iterable[dict[str, torch.Tensor]], transport: str = "object_store", version: int = 0,
    loopback: bool = True,
) -> WeightPublication:
    """The manifest of gathered buckets (empty buckets, those of ranks that keep
    nothing, are left out), each stored as soon as it is gathered: in the object
    store, or staged for NIXL readers under `version`."""
    carrier = transport_named(transport, loopback)
    names, sizes, stored = [], [], []
    for bucket in buckets:
        if not bucket:
            continue
        names.append(tuple(bucket))
        sizes.append(sum(t.numel() * t.element_size() for t in bucket.values()))
        stored.append(carrier.stage(len(stored), bucket, version))
        del bucket
    return WeightPublication(tuple(names), tuple(sizes), tuple(stored), carrier.peer())
