"""torch.distributed.checkpoint (DCP) reads and writes without unpickling code (S-SEC-2).

DCP unpickles its `.metadata` and any non-tensor value. Here `.metadata` goes through an
unpickler that builds only DCP's metadata classes and the torch types they hold, and a
non-tensor value is refused (the state dicts saved here hold tensors only); tensors are
read by DCP itself with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from compat.torch_compat import METADATA_FILE as METADATA_FILE  # the file name sharded_role.py looks for
from compat.torch_compat import dcp_metadata_path, dcp_metadata_private_globals


# DCP's public metadata classes; the private ones its pickle names come from compat/.
_PUBLIC_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "ChunkStorageMetadata", "BytesStorageMetadata",
    )
} | {
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class UnsafeCheckpointFile(RuntimeError):
    """A DCP file that would need more than tensors and DCP's metadata classes to read."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, handle: Any, path: str) -> None:
        super().__init__(handle)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PUBLIC_GLOBALS or (module, name) in dcp_metadata_private_globals():
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointFile(
            f"{self.path} is not DCP metadata: it names {module}.{name}, which is not loaded"
        )


class SafeReader(FileSystemReader):
    """DCP's file reader with `.metadata` read through the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = dcp_metadata_path(self, kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle, str(path)).load()
        if not isinstance(metadata, Metadata):
            raise UnsafeCheckpointFile(f"{path} holds {type(metadata).__name__}, not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorOnlyLoadPlanner(DefaultLoadPlanner):
    """Refuses a non-tensor value instead of `torch.load(weights_only=False)` on it."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        raise UnsafeCheckpointFile(
            f"{read_item.dest_index.fqn} is stored as pickled bytes; only tensors are loaded"
        )


def save_tensors(state: dict[str, Any], directory: str) -> None:
    """Every rank writes its own shard file; rank 0 also writes `.metadata`. A
    collective when a process group exists (every rank must call it)."""
    # sync_files: each rank fsyncs its shards (S-CKPT-9); the commit syncs the folders.
    dcp.save(state, storage_writer=FileSystemWriter(directory, sync_files=True))


def load_tensors(state: dict[str, Any], directory: str, *, alone: bool = False) -> None:
    """Fill `state`'s tensors in place from `directory`, resharded to their layout
    (DTensor shards, or whole tensors on one rank). A collective when a process group
    exists, unless `alone`: one process reading whole tensors (the export, which runs
    in policy rank 0's actor while the other ranks do not take part)."""
    reader = SafeReader(directory)
    reader.read_metadata()  # a refusal named here, not folded into DCP's collective error
    dcp.load(state, storage_reader=reader, planner=TensorOnlyLoadPlanner(), no_dist=alone)
