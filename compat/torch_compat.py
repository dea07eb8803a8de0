"""torch's private internals, used only on the torch versions they were written against.

Reading a DCP checkpoint's `.metadata` without unpickling code (checkpoint/dcp_io.py,
S-SEC-2) needs two: the private names DCP's metadata pickle refers to (an enum, a
storage record and the layout function torch pickles a layout with), allowed beside
DCP's public metadata classes, and the reader's own rule for where `.metadata` is.
Outside `WRITTEN_FOR` only the public classes are allowed, so a `.metadata` naming a
private one is refused by name rather than unpickled; and the path is built from the
reader's public `fs` and `path` with DCP's file name.
"""

from __future__ import annotations

from typing import Any

from packaging.specifiers import SpecifierSet

from compat.versions import within

WRITTEN_FOR = SpecifierSet(">=2.13,<2.14")

METADATA_FILE = ".metadata"  # DCP's file name for the checkpoint's metadata
# (module, name) of each private global a DCP `.metadata` pickle names.
DCP_METADATA_PRIVATE_GLOBALS = frozenset({
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
})


def dcp_metadata_private_globals() -> frozenset[tuple[str, str]]:
    """The private globals a `.metadata` may name to be read; none outside the range."""
    if within("torch", WRITTEN_FOR, "reading DCP metadata that names torch's private classes",
              "only DCP's public metadata classes are read"):
        return DCP_METADATA_PRIVATE_GLOBALS
    return frozenset()


def dcp_metadata_path(reader: Any, rank: int | None) -> Any:
    """Where a DCP `FileSystemReader` keeps `.metadata` (rank None) or a rank's own one."""
    if within("torch", WRITTEN_FOR, "the DCP reader's own metadata path", "its fs and path with '.metadata'"):
        return reader._get_metadata_path(rank)
    return reader.fs.concat_path(reader.path, METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}")
