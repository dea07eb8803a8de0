"""Writes that survive a power cut once they return (S-CKPT-9).

A write that has returned sits in the page cache: after a power cut, a kernel panic or a
node killed without a clean shutdown, a file can come back empty and a new name can be
gone, while a marker written later (and synced) survives. Every writer of a run's files
goes through here so that a marker never vouches for anything still in memory:
`replace_durably` for a file readers may see at any moment (temporary file, fsync,
rename, fsync of its folder), `write_synced` for a file of a boundary (its name is
trusted only once `_SUCCESS` vouches for it; the commit syncs the folders,
`sync_boundary`), `append_synced` for metrics.jsonl.

Only a local (or mounted) path can be synced: an fsspec store that is not a mounted
path has no fsync, and these writes are then only as durable as the store makes them
(docs/checkpoints.md); such stores are refused for checkpoints (S-CKPT-7).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Iterable

import fsspec
from fsspec.implementations.local import LocalFileSystem


def local_path(path: str) -> str | None:
    """`path` as a local path when it is one (plain, `file://`, `local://`); else None."""
    fs, local = fsspec.core.url_to_fs(path)
    return local if isinstance(fs, LocalFileSystem) else None


def _bytes(payload: bytes | str) -> bytes:
    return payload.encode() if isinstance(payload, str) else payload


def _fsync(local: str) -> None:
    descriptor = os.open(local, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_file(path: str) -> None:
    """fsync `path` (a file, or a folder: its entries); nothing for a store that is not local."""
    local = local_path(path)
    if local is not None:
        _fsync(local)


def sync_folder(path: str) -> None:
    """Makes the folder's entries (files created, renamed or removed in it) durable."""
    sync_file(path)


def _write(fs: Any, target: str, payload: bytes | str, mode: str = "wb") -> None:
    """Through the path's fsspec filesystem (the project's storage boundary), fsynced
    before the handle closes where the filesystem is local."""
    with fs.open(target, mode) as handle:
        handle.write(_bytes(payload) if "b" in mode else payload)
        if isinstance(fs, LocalFileSystem):
            handle.flush()
            os.fsync(handle.fileno())


def _folder(target: str) -> str:
    return target.rsplit("/", 1)[0] or "/"  # fsspec paths are posix; a local one is absolute


def write_synced(path: str, payload: bytes | str) -> None:
    """Write `path` in place and fsync it before returning."""
    fs, target = fsspec.core.url_to_fs(path)
    fs.makedirs(_folder(target), exist_ok=True)  # as fsspec.open does; the commit syncs the folders
    _write(fs, target, payload)


def replace_durably(path: str, payload: bytes | str) -> None:
    """Readers see the old content or the new, never a torn file, and once this
    returns the new content survives a power cut: temporary file beside the target,
    fsync, rename over it, fsync of the folder."""
    fs, target = fsspec.core.url_to_fs(path)
    local = isinstance(fs, LocalFileSystem)
    temp = f"{_folder(target)}/.{target.rsplit('/', 1)[-1]}.{uuid.uuid4().hex}.tmp"
    try:
        _write(fs, temp, payload)
        if local:
            os.replace(temp, target)
        else:
            fs.mv(temp, target)
    except BaseException:
        if fs.exists(temp):
            fs.rm(temp)
        raise
    if local:
        _fsync(_folder(target))


def append_synced(path: str, text: str) -> None:
    """Append `text` and fsync; a file this creates is made durable in its folder too."""
    fs, target = fsspec.core.url_to_fs(path)
    created = not fs.exists(target)
    _write(fs, target, text, mode="a")
    if created and isinstance(fs, LocalFileSystem):
        _fsync(_folder(target))


def make_folders(path: str) -> None:
    """`makedirs`, with each folder it creates made durable in its parent: a pointer
    synced inside a folder whose own name was never synced is lost with the folder."""
    local = local_path(path)
    if local is None:
        fs, remote = fsspec.core.url_to_fs(path)
        fs.makedirs(remote, exist_ok=True)
        return
    missing, folder = [], Path(os.path.abspath(local))
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    os.makedirs(local, exist_ok=True)
    for created in reversed(missing):
        sync_folder(str(created.parent))


def sync_boundary(boundary: str, relative_files: Iterable[str]) -> None:
    """Before a marker is written: every file it will vouch for fsynced (again: a
    writer in another process may have skipped it, as DCP's folders are never synced),
    every folder holding one, the boundary and the folder holding the boundary."""
    root = local_path(boundary)
    if root is None:
        return
    root = root.rstrip("/")
    folders = {root, os.path.dirname(root)}
    for relative in relative_files:
        path = f"{root}/{relative}"
        sync_file(path)
        folder = os.path.dirname(path)
        while folder.startswith(root) and folder not in folders:
            folders.add(folder)
            folder = os.path.dirname(folder)
    for folder in sorted(folders, key=len, reverse=True):  # deepest first, the boundary's parent last
        sync_folder(folder)


def sync_tree(root: str) -> None:
    """Every file and folder under `root` (an export written aside), before it is
    renamed into place."""
    local = local_path(root)
    if local is None:
        return
    for folder, _, files in os.walk(local, topdown=False):
        for name in files:
            sync_file(os.path.join(folder, name))
        sync_folder(folder)
