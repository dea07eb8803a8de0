"""The two ways a bucket travels (`rl.weight_sync_transport`), behind one interface:
the policy stages each bucket, an engine reads it back. The set of engines to serve
is an argument of `deliver`, never fixed at publication, so an engine started late
(a replacement) is one more receiver of the version that is current.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

if TYPE_CHECKING:  # imported where a bucket moves: `deliver` alone needs neither torch nor NIXL
    import torch

    from weights.nixl_transport import NixlBucket, NixlPeer

TRANSPORTS = ("object_store", "nixl")


class Transport(Protocol):
    name: str

    def stage(self, index: int, bucket: dict[str, torch.Tensor], version: int) -> Any:
        """Publishing side: keep `bucket` where receivers can read it; returns its handle."""
        ...

    def peer(self) -> NixlPeer | None:
        """What a receiver must know of the publisher beyond the handles (NIXL's agent)."""
        ...

    def read(
        self, peer: NixlPeer | None, stored: Any, where: str, deadline: float, owned: bool
    ) -> dict[str, torch.Tensor]:
        """Receiving side: the bucket `stored` names, checked as the transport can."""
        ...

    def check_version(self, stored: Sequence[Any], version: int, receiver: str) -> None:
        """Receiving side, before any bucket is read: refuse handles that say they carry
        another version than the one the receiver is told to take."""
        ...


class ObjectStoreTransport:
    """Each bucket `ray.put` by the policy's process (the dict itself outside a Ray
    actor); a receiver `ray.get`s it. A bucket lives while a manifest refers to it, so
    whoever still has engines to serve keeps the manifest."""

    name = "object_store"

    def __init__(self) -> None:
        self._store = _bucket_store()

    def stage(self, index: int, bucket: dict[str, torch.Tensor], version: int) -> Any:
        return self._store(bucket)

    def peer(self) -> NixlPeer | None:
        return None

    def read(
        self, peer: NixlPeer | None, stored: Any, where: str, deadline: float, owned: bool
    ) -> dict[str, torch.Tensor]:
        if isinstance(stored, dict):
            return stored
        import ray

        return ray.get(stored)

    def check_version(self, stored: Sequence[Any], version: int, receiver: str) -> None:
        """An object-store bucket carries no version: the manifest's is the caller's."""


class NixlTransport:
    """Buckets staged in the policy's registered memory under the version; a receiver
    READs one and checks version and checksum (weights/nixl_transport.py). The policy's
    regions hold the current version until the next is staged."""

    name = "nixl"

    def __init__(self, loopback: bool) -> None:
        self.loopback = loopback
        self._publisher: Any = None  # a rank that publishes nothing starts no NIXL agent

    def stage(self, index: int, bucket: dict[str, torch.Tensor], version: int) -> NixlBucket:
        from weights.nixl_transport import publisher as nixl_publisher

        self._publisher = self._publisher or nixl_publisher(self.loopback)
        return self._publisher.stage(index, bucket, version)

    def peer(self) -> NixlPeer | None:
        return self._publisher.peer if self._publisher is not None else None

    def read(
        self, peer: NixlPeer | None, stored: Any, where: str, deadline: float, owned: bool
    ) -> dict[str, torch.Tensor]:
        from weights.nixl_transport import reader as nixl_reader

        assert peer is not None
        return nixl_reader(self.loopback).read(peer, stored, where, deadline, owned)

    def check_version(self, stored: Sequence[Any], version: int, receiver: str) -> None:
        from weights.nixl_transport import WeightTransferError

        stale = [bucket.version for bucket in stored if bucket.version != version]
        if stale:
            raise WeightTransferError(
                f"weight sync over nixl: {receiver} was handed buckets of policy_version {stale[0]} "
                f"as policy_version {version}"
            )


def transport_named(name: str, loopback: bool = True) -> Transport:
    if name == "nixl":
        return NixlTransport(loopback)
    if name == "object_store":
        return ObjectStoreTransport()
    raise ValueError(f"rl.weight_sync_transport={name!r}: accepted transports are {', '.join(TRANSPORTS)}")


def deliver(published: Any, version: int, engines: Sequence[Any], call: Callable[..., Any]) -> list[Any]:
    """`published` (as `version`) handed to every engine of the live set `engines`,
    each call made through `call` (a runner's, or a Ray `.remote`)."""
    return [call(engine.load_weights, published, version) for engine in engines]


def _bucket_store() -> Callable[[dict[str, torch.Tensor]], Any]:
    """`ray.put` inside a Ray actor (the role's process then drops the bucket), the
    bucket itself anywhere else (a driver or a test holding role objects)."""
    try:
        import ray

        from compat.ray_compat import current_actor
    except ImportError:
        return _keep
    if current_actor() is not None:
        return ray.put
    return _keep


def _keep(bucket: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return bucket
