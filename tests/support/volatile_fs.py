"""A FUSE filesystem that keeps written data only once it is fsynced, for power-cut tests
(S-CKPT-9).

Like a disk behind a volatile write cache, at its most forgetful: a file's bytes survive
a cut only as they were at its last fsync (a file never synced comes back empty), and a
folder's entries (created, renamed, removed) only as they were at the folder's last
fsync (`--metadata strict`, the default: what POSIX promises), or as they were at the last
fsync of anything (`--metadata journaled`: a journaling filesystem such as ext4, where
any fsync commits every earlier create, rename and removal, but not other files' data:
the empty files after a crash that this filesystem is known for). A cut puts every
file and folder back to that durable state and fails every later operation with EIO
until the filesystem is unmounted, as a machine without power would.

    python -m tests.support.volatile_fs IMAGE MOUNTPOINT [--cut-at N] [--log FILE] [--metadata journaled]

IMAGE is a plain folder holding the durable state: read in whole at mount, written back
whole at unmount (after a cut, the durable state; after a clean unmount, everything, as a
clean shutdown syncs). `--cut-at N` cuts just before the N-th changing operation (create,
mkdir, write, truncate, rename, unlink, rmdir, fsync, fsyncdir; counted from 1);
`--log FILE` writes one line per changing operation, `N op path`. Creating the file
CUT_NAME in the root cuts at once. tests/support/power_cut.py mounts and drives it.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import os
import shutil
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import mfusepy as fuse

CUT_NAME = ".power-cut"


@dataclass(eq=False)
class Node:
    """A file or a folder: what readers see now, and what a cut would leave."""

    is_dir: bool
    mode: int
    data: bytearray = field(default_factory=bytearray)
    synced_data: bytes = b""
    entries: dict[str, "Node"] = field(default_factory=dict)
    synced_entries: dict[str, "Node"] = field(default_factory=dict)
    mtime_ns: int = field(default_factory=time.time_ns)

    def sync(self) -> None:
        if self.is_dir:
            self.synced_entries = dict(self.entries)
        else:
            self.synced_data = bytes(self.data)

    def sync_entries_below(self) -> None:
        if self.is_dir:
            self.synced_entries = dict(self.entries)
            for child in self.entries.values():
                child.sync_entries_below()

    def forget_unsynced(self) -> None:
        if self.is_dir:
            self.entries = dict(self.synced_entries)
            for child in self.entries.values():
                child.forget_unsynced()
        else:
            self.data = bytearray(self.synced_data)


def load_image(folder: Path) -> Node:
    """Everything in the image is durable: it is what survived the last unmount."""
    node = Node(is_dir=True, mode=stat.S_IFDIR | 0o755)
    for entry in sorted(folder.iterdir()):
        if entry.is_dir():
            node.entries[entry.name] = load_image(entry)
        else:
            child = Node(is_dir=False, mode=stat.S_IFREG | (entry.stat().st_mode & 0o777))
            child.data = bytearray(entry.read_bytes())
            node.entries[entry.name] = child
    node.sync()
    for child in node.entries.values():
        child.sync()
    return node


def save_image(node: Node, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, child in node.entries.items():
        if child.is_dir:
            save_image(child, folder / name)
        else:
            (folder / name).write_bytes(bytes(child.data))


class VolatileFS(fuse.Operations):
    use_ns = True

    def __init__(self, image: Path, cut_at: int | None, log: TextIO | None, journaled: bool = False):
        self.image = image
        self.journaled = journaled
        self.root = load_image(image)
        self.cut_at = cut_at
        self.log = log
        self.changes = 0
        self.cut = False
        self.handles: dict[int, Node] = {}
        self.next_handle = itertools.count(1)

    # -- the cut --------------------------------------------------------------------
    def _alive(self) -> None:
        if self.cut:
            raise fuse.FuseOSError(errno.EIO)

    def _change(self, op: str, path: str | None) -> None:
        """Every changing operation passes here first: the moment a cut can fall on."""
        self._alive()
        self.changes += 1
        if self.log is not None:
            self.log.write(f"{self.changes} {op} {path}\n")
            self.log.flush()
        if self.cut_at is not None and self.changes >= self.cut_at:
            self.power_cut()
            raise fuse.FuseOSError(errno.EIO)

    def power_cut(self) -> None:
        self.root.forget_unsynced()
        self.cut = True
        if self.log is not None:
            self.log.write(f"{self.changes} CUT -\n")
            self.log.flush()

    def destroy(self, path: str) -> None:
        """Unmount: the image becomes what survived (after a cut) or everything."""
        staging = self.image.with_name(self.image.name + ".saving")
        shutil.rmtree(staging, ignore_errors=True)
        save_image(self.root, staging)
        shutil.rmtree(self.image)
        staging.rename(self.image)

    # -- lookups --------------------------------------------------------------------
    def _find(self, path: str) -> Node:
        node = self.root
        for part in (p for p in path.split("/") if p):
            if not node.is_dir or part not in node.entries:
                raise fuse.FuseOSError(errno.ENOENT)
            node = node.entries[part]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._find(head or "/")
        if not parent.is_dir:
            raise fuse.FuseOSError(errno.ENOTDIR)
        return parent, name

    def _handle(self, node: Node) -> int:
        handle = next(self.next_handle)
        self.handles[handle] = node
        return handle

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        self._alive()
        node = self.handles.get(fh) if fh else None
        node = node or self._find(path)
        size = 4096 if node.is_dir else len(node.data)
        return {
            "st_mode": node.mode, "st_nlink": 2 if node.is_dir else 1, "st_size": size,
            "st_blocks": (size + 511) // 512, "st_uid": os.getuid(), "st_gid": os.getgid(),
            "st_atime": node.mtime_ns, "st_mtime": node.mtime_ns, "st_ctime": node.mtime_ns,
        }

    def readdir(self, path: str, fh: int) -> list[str]:
        self._alive()
        return [".", "..", *self._find(path).entries]

    def opendir(self, path: str) -> int:
        self._alive()
        return self._handle(self._find(path))

    def releasedir(self, path: str, fh: int) -> int:
        self.handles.pop(fh, None)
        return 0

    def open(self, path: str, flags: int) -> int:
        self._alive()
        node = self._find(path)
        if flags & os.O_TRUNC:
            self._change("truncate", path)
            node.data.clear()
        return self._handle(node)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._alive()
        return bytes(self.handles[fh].data[offset : offset + size])

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 24, "f_bfree": 1 << 23,
                "f_bavail": 1 << 23, "f_files": 1 << 20, "f_ffree": 1 << 19, "f_namemax": 255}

    def access(self, path: str, amode: int) -> int:
        self._alive()
        self._find(path)
        return 0

    # -- changes --------------------------------------------------------------------
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        if path.rstrip("/") == f"/{CUT_NAME}":
            self._alive()
            self.power_cut()
            raise fuse.FuseOSError(errno.EIO)
        self._change("create", path)
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            node = parent.entries[name] = Node(is_dir=False, mode=stat.S_IFREG | (mode & 0o777))
        else:
            node.data.clear()
        return self._handle(node)

    def mkdir(self, path: str, mode: int) -> int:
        self._change("mkdir", path)
        parent, name = self._parent(path)
        if name in parent.entries:
            raise fuse.FuseOSError(errno.EEXIST)
        parent.entries[name] = Node(is_dir=True, mode=stat.S_IFDIR | (mode & 0o777))
        return 0

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._change("write", path)
        node = self.handles[fh]
        if offset > len(node.data):
            node.data.extend(bytes(offset - len(node.data)))
        node.data[offset : offset + len(data)] = data
        node.mtime_ns = time.time_ns()
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._change("truncate", path)
        node = self.handles.get(fh) if fh else None
        node = node or self._find(path)
        del node.data[length:]
        node.data.extend(bytes(length - len(node.data)))
        return 0

    def rename(self, old: str, new: str) -> int:
        self._change("rename", f"{old} -> {new}")
        source, old_name = self._parent(old)
        target, new_name = self._parent(new)
        node = source.entries.get(old_name)
        if node is None:
            raise fuse.FuseOSError(errno.ENOENT)
        replaced = target.entries.get(new_name)
        if replaced is not None and replaced.is_dir and replaced.entries:
            raise fuse.FuseOSError(errno.ENOTEMPTY)
        del source.entries[old_name]
        target.entries[new_name] = node
        return 0

    def unlink(self, path: str) -> int:
        self._change("unlink", path)
        parent, name = self._parent(path)
        if name not in parent.entries:
            raise fuse.FuseOSError(errno.ENOENT)
        del parent.entries[name]
        return 0

    def rmdir(self, path: str) -> int:
        self._change("rmdir", path)
        parent, name = self._parent(path)
        if parent.entries[name].entries:
            raise fuse.FuseOSError(errno.ENOTEMPTY)
        del parent.entries[name]
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._change("fsync", path)
        self._sync(self.handles[fh])
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._change("fsyncdir", path)
        self._sync(self.handles[fh])
        return 0

    def _sync(self, node: Node) -> None:
        node.sync()
        if self.journaled:  # the journal commit carries every folder's changes so far
            self.root.sync_entries_below()

    def flush(self, path: str, fh: int) -> int:
        self._alive()
        return 0

    def release(self, path: str, fh: int) -> int:
        self.handles.pop(fh, None)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._alive()
        node = self._find(path)
        node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._alive()
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._alive()
        self._find(path).mtime_ns = times[1] if times else time.time_ns()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("image", type=Path)
    parser.add_argument("mountpoint")
    parser.add_argument("--cut-at", type=int, default=None)
    parser.add_argument("--log", default=None)
    parser.add_argument("--metadata", choices=["strict", "journaled"], default="strict")
    args = parser.parse_args(argv)
    log = open(args.log, "a") if args.log else None
    operations = VolatileFS(args.image, args.cut_at, log, journaled=args.metadata == "journaled")
    # hard_remove: no `.fuse_hidden` renames of open files that are removed; zero
    # timeouts and no caching beyond this mount: every operation reaches this process.
    fuse.FUSE(operations, args.mountpoint, foreground=True, nothreads=True, hard_remove=True,
              attr_timeout=0, entry_timeout=0, negative_timeout=0, fsname="volatile_fs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
