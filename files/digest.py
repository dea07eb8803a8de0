"""A file's size and sha256, read in chunks: what a commit records of each boundary
file (S-FAULT-3) and what a base model's fingerprint records of each weight file, so
both rooms share one reading of a file below them."""

from __future__ import annotations

import hashlib
from typing import Any

CHUNK_BYTES = 1 << 20


def file_digest(fs: Any, path: str) -> dict[str, Any]:
    """Size and sha256 of one file, read in chunks so a large shard never sits in memory."""
    digest = hashlib.sha256()
    size = 0
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}
