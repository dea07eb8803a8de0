"""Weight buckets over NIXL (S-XFER-1), the `rl.weight_sync_transport=nixl` path.

The publishing policy rank copies each bucket into memory registered with its process's
NIXL agent, headed by the policy_version; an engine READs the bucket into its own
registered buffer, checks the version and an XXH3 checksum of the bytes, and only then hands the
tensors on. What travels through Ray is the agent's metadata and one serialized
descriptor per bucket, a few kilobytes: no weight byte passes through the controller
or the object store. docs/weight-transport.md says what each side holds.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from weights.nixl_package import nixl_module

HEADER_BYTES = 64  # the policy_version (int64), padded so every tensor starts aligned
ALIGN = 64


class WeightTransferError(RuntimeError):
    """A bucket that could not be read, arrived late, or arrived other than published."""


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the bucket's region (the header included)
    nbytes: int


@dataclass(frozen=True)
class NixlPeer:
    """The publishing agent, as a reader adds it: its name and metadata."""

    agent: str
    metadata: bytes


@dataclass(frozen=True)
class NixlBucket:
    """One published bucket: where it lies in the publisher's registered memory and
    what a reader must find there."""

    descriptor: bytes  # the publisher's serialized descriptor of the region
    nbytes: int  # header and payload
    version: int
    checksum: int  # XXH3-64 of the payload (everything after the header)
    slots: tuple[TensorSlot, ...]


_agents: dict[str, Any] = {}


PUMP_INTERVAL_S = 0.002


def process_agent(role: str, loopback: bool, serves: bool = False) -> Any:
    """This process's agent for `role`, created on first use and kept: one per actor
    process (two in an in-process run, which hosts both ends). A single-node run keeps
    UCX's listening sockets on loopback unless UCX_NET_DEVICES says otherwise.

    NIXL's own progress thread polls without pause, a whole core per agent, so it is
    off: a reader progresses its transfers while it polls them, and an agent that
    `serves` reads (the publisher, whose peers need its progress to connect, and over
    TCP to read) is progressed by a thread of ours every few milliseconds."""
    if role not in _agents:
        if loopback:
            os.environ.setdefault("UCX_NET_DEVICES", "lo")
        module = nixl_module()
        name = f"{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        config = module.nixl_agent_config(
            enable_prog_thread=False, backends=["UCX"],
            # The pump thread and the role's own calls share the agent.
            sync_mode=module.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT if serves else None,
        )
        agent = module.nixl_agent(name, config)
        if serves:
            if not _pumps:
                atexit.register(_stop_pumps)
            pump = threading.Thread(target=_pump, args=(agent,), name=f"nixl-progress-{role}", daemon=True)
            pump.start()
            _pumps.append(pump)
        _agents[role] = agent
    return _agents[role]


_pumps: list[threading.Thread] = []
_stopping = threading.Event()


def _pump(agent: Any) -> None:
    while not _stopping.wait(PUMP_INTERVAL_S):
        agent.get_new_notifs()  # drives the UCX worker: connection requests, and TCP reads


def _stop_pumps() -> None:
    """At exit, before the agents are destroyed: a pump still inside NIXL while its
    agent is torn down aborts the process ("terminate called without an active
    exception")."""
    _stopping.set()
    for pump in _pumps:
        pump.join(timeout=5)


def _payload_layout(bucket: dict[str, torch.Tensor]) -> tuple[tuple[TensorSlot, ...], int]:
    slots, offset = [], HEADER_BYTES
    for name, tensor in bucket.items():
        nbytes = tensor.numel() * tensor.element_size()
        slots.append(TensorSlot(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return tuple(slots), offset


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _checksum(region: torch.Tensor) -> int:
    return xxhash.xxh3_64_intdigest(region[HEADER_BYTES:].numpy())


class NixlPublisher:
    """The publishing side: one registered region per bucket index, reused from
    version to version (a model's buckets keep their sizes), so a version costs copies
    and checksums, not registrations. It holds one host copy of the published weights."""

    def __init__(self, agent: Any):
        self.agent = agent
        self.regions: list[torch.Tensor] = []
        self.registrations: list[Any] = []

    @property
    def peer(self) -> NixlPeer:
        return NixlPeer(self.agent.name, self.agent.get_agent_metadata())

    def _region(self, index: int, nbytes: int) -> torch.Tensor:
        if index < len(self.regions) and self.regions[index].numel() >= nbytes:
            return self.regions[index]
        region = torch.zeros(nbytes, dtype=torch.uint8)
        registration = self.agent.register_memory(region)
        if index < len(self.regions):
            self.agent.deregister_memory(self.registrations[index])
            self.regions[index], self.registrations[index] = region, registration
        else:
            self.regions.append(region)
            self.registrations.append(registration)
        return region

    def stage(self, index: int, bucket: dict[str, torch.Tensor], version: int) -> NixlBucket:
        slots, nbytes = _payload_layout(bucket)
        region = self._region(index, nbytes)[:nbytes]
        region.zero_()  # the alignment gaps are part of the checksum
        region[:8].view(torch.int64)[0] = version
        for slot, tensor in zip(slots, bucket.values()):
            region[slot.offset : slot.offset + slot.nbytes].copy_(_as_bytes(tensor))
        descriptor = self.agent.get_serialized_descs(self.agent.get_xfer_descs([region]))
        return NixlBucket(descriptor, nbytes, version, _checksum(region), slots)


class NixlReader:
    """The engine's side: one registered receive buffer, grown to the largest bucket,
    so an engine holds one bucket in flight as with the object store."""

    def __init__(self, agent: Any):
        self.agent = agent
        self.buffer: torch.Tensor | None = None
        self.registration: Any = None
        self.peers: dict[str, bytes] = {}  # agent name -> the metadata it was added with

    def _receive_buffer(self, nbytes: int) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < nbytes:
            if self.registration is not None:
                self.agent.deregister_memory(self.registration)
            self.buffer = torch.zeros(nbytes, dtype=torch.uint8)
            self.registration = self.agent.register_memory(self.buffer)
        return self.buffer[:nbytes]

    def read(
        self, peer: NixlPeer, bucket: NixlBucket, where: str, deadline: float, owned: bool = True
    ) -> dict[str, torch.Tensor]:
        """The bucket's tensors: copies when `owned`, else views of the receive buffer,
        valid until the next read. `where` names the engine and the bucket in errors."""
        known = self.peers.get(peer.agent)
        if known != peer.metadata:  # new, or it registered memory since: its metadata names every region
            if known is not None:
                self.agent.remove_remote_agent(peer.agent)
            self.agent.add_remote_agent(peer.metadata)
            self.peers[peer.agent] = peer.metadata
        region = self._receive_buffer(bucket.nbytes)
        self._transfer(peer.agent, region, bucket.descriptor, where, deadline)
        version = int(region[:8].view(torch.int64)[0])
        if version != bucket.version:
            raise WeightTransferError(
                f"weight sync over nixl: {where} holds policy_version {version}, not {bucket.version}: the policy "
                "replaced its buckets before this engine read them"
            )
        checksum = _checksum(region)
        if checksum != bucket.checksum:
            raise WeightTransferError(
                f"weight sync over nixl: {where} arrived corrupted (checksum {checksum:#018x}, published "
                f"{bucket.checksum:#018x}); the engine does not take this version"
            )
        tensors = {
            slot.name: region[slot.offset : slot.offset + slot.nbytes].view(getattr(torch, slot.dtype)).reshape(
                slot.shape
            )
            for slot in bucket.slots
        }
        return {name: tensor.clone() for name, tensor in tensors.items()} if owned else tensors

    def _transfer(self, remote: str, region: torch.Tensor, descriptor: bytes, where: str, deadline: float) -> None:
        handle = None
        try:
            local = self.agent.get_xfer_descs([region])
            handle = self.agent.initialize_xfer("READ", local, self.agent.deserialize_descs(descriptor), remote)
            state = self.agent.transfer(handle)
            polls = 0
            while state != "DONE":
                if state == "ERR":
                    raise WeightTransferError(f"weight sync over nixl: reading {where} from {remote} failed")
                if time.monotonic() > deadline:
                    raise WeightTransferError(
                        f"weight sync over nixl: {where} from {remote} did not arrive within the stage's time "
                        "(rl.stage_timeout_seconds); is the policy's process stopped?"
                    )
                polls += 1
                if polls > 100:
                    time.sleep(0.001)
                state = self.agent.check_xfer_state(handle)
        except WeightTransferError:
            raise
        except Exception as error:  # NIXL's own errors (a peer that is gone, a refused descriptor)
            raise WeightTransferError(
                f"weight sync over nixl: reading {where} from {remote} failed: {error}"
            ) from error
        finally:
            if handle is not None:
                try:
                    self.agent.release_xfer_handle(handle)
                except Exception:  # a transfer NIXL cannot cancel keeps its handle; the error above stands
                    pass


_publishers: dict[int, NixlPublisher] = {}
_readers: dict[int, NixlReader] = {}


def publisher(loopback: bool) -> NixlPublisher:
    agent = process_agent("policy", loopback, serves=True)
    return _publishers.setdefault(id(agent), NixlPublisher(agent))


def reader(loopback: bool) -> NixlReader:
    agent = process_agent("rollout", loopback)
    return _readers.setdefault(id(agent), NixlReader(agent))


def held_bytes() -> tuple[int, int]:
    """(bytes this process keeps staged for readers, bytes of its receive buffers):
    the memory the transport holds between versions."""
    staged = sum(region.numel() for p in _publishers.values() for region in p.regions)
    received = sum(r.buffer.numel() for r in _readers.values() if r.buffer is not None)
    return staged, received
