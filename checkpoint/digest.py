"""Content digests of model and optimizer state.

Used twice: to verify that what a role wrote re-reads to exactly what it holds
(S-CKPT-2, "verified resumable"), and by tests that must prove "byte-for-byte
unchanged" (S-CW-2) without keeping copies of whole models around.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import torch


def _update(digest: "hashlib._Hash", value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, Mapping):
        digest.update(b"{")
        for key in sorted(value, key=str):
            digest.update(repr(key).encode())
            _update(digest, value[key])
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for item in value:
            _update(digest, item)
        digest.update(b"]")
    else:
        digest.update(repr(value).encode())


def state_digest(value: Any) -> str:
    """sha256 over tensors' bytes, dtypes and shapes and over plain values, in a
    key-sorted order so dict insertion order does not matter."""
    digest = hashlib.sha256()
    _update(digest, value)
    return digest.hexdigest()
