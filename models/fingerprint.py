"""What the base model *is*, by content: a digest over its config, tokenizer and
weight files, so a resume over another model, or over files changed in place, is
refused by name instead of training on silently (S-SEC-4).

Streams files with sha256 (docs/performance.md "The base-model fingerprint" has the
rate); a file whose size and modification time match the cache's record is not read
again (see `FingerprintCache` for what that trusts). Imports neither torch nor
transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from files.digest import file_digest

_LOCAL = fsspec.filesystem("file")
# Files that say nothing about the weights the roles load: our own build records (the
# tiny pre-training report holds its wall time) and model cards. Hidden files (a hub
# cache's `.cache/`, `.gitattributes`) are skipped too.
IGNORED_NAMES = frozenset({
    "tiny_spec.json", "tiny_pretrain.json", "tiny_reward_spec.json", "tiny_reward_training.json",
    "README.md", "LICENSE", "LICENSE.txt"})
CACHE_ENV = "PPO_FINGERPRINT_CACHE"  # a file path, or "off"


@dataclass(frozen=True)
class ModelFingerprint:
    digest: str  # "sha256:<hex>" over every file's name and digest
    files: dict[str, str] = field(default_factory=dict)  # relative name -> sha256 hex of its bytes
    revision: str | None = None  # a hub model's resolved commit

    @property
    def short(self) -> str:
        return self.digest.removeprefix("sha256:")[:16]

    def describe(self) -> str:
        at = f" at revision {self.revision}" if self.revision else ""
        return f"sha256:{self.short}…{at} ({len(self.files)} files)"

    def first_difference(self, other: "ModelFingerprint") -> str | None:
        """The first file, in name order, that one side lacks or whose bytes differ."""
        for name in sorted(set(self.files) | set(other.files)):
            mine, theirs = self.files.get(name), other.files.get(name)
            if mine != theirs:
                if mine is None:
                    return f"{name} (only in the recorded model)" if theirs else name
                return f"{name} (not in the recorded model)" if theirs is None else name
        return None

    def first_difference_from(self, record_path: str, recorded_digest: str) -> str | None:
        """`first_difference` against the per-file record at `record_path`, when that
        record is the one behind `recorded_digest` (else nothing can be named)."""
        recorded = read_fingerprint(record_path)
        if recorded is None or recorded.digest != recorded_digest:
            return None
        return self.first_difference(recorded)

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "revision": self.revision, "files": self.files}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> "ModelFingerprint":
        return cls(digest=str(value["digest"]), files=dict(value.get("files") or {}), revision=value.get("revision"))


def model_files(folder: Path) -> list[Path]:
    """Every file the model is made of, in a fixed order."""
    found = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts) or path.name in IGNORED_NAMES:
            continue
        if path.is_file():
            found.append(path)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


class FingerprintCache:
    """File digests keyed by real path, size and modification time (nanoseconds).

    What it trusts: that a file whose size and mtime are both unchanged holds the same
    bytes. An edit that keeps both (a tool that restores the mtime, a filesystem with
    coarse timestamps written twice within one tick) goes unseen; set
    `PPO_FINGERPRINT_CACHE=off` to read every file on every start.
    """

    def __init__(self, location: Path | None):
        self.location = location
        self.entries: dict[str, list[Any]] = {}
        self.changed = False
        if location is not None and location.is_file():
            try:
                self.entries = json.loads(location.read_text())
            except (OSError, ValueError):
                self.entries = {}

    @classmethod
    def default(cls) -> "FingerprintCache":
        chosen = os.environ.get(CACHE_ENV)
        if chosen == "off":
            return cls(None)
        if chosen:
            return cls(Path(chosen))
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return cls(base / "ppo-flow" / "model-fingerprints.json")

    def digest(self, path: Path) -> str:
        stat = path.stat()
        key = str(path.resolve())
        known = self.entries.get(key)
        if known is not None and known[0] == stat.st_size and known[1] == stat.st_mtime_ns:
            return str(known[2])
        value = str(file_digest(_LOCAL, str(path))["sha256"])
        if self.location is not None:
            self.entries[key] = [stat.st_size, stat.st_mtime_ns, value]
            self.changed = True
        return value

    def save(self) -> None:
        if self.location is None or not self.changed:
            return
        try:
            self.location.parent.mkdir(parents=True, exist_ok=True)
            staging = self.location.with_suffix(f".{os.getpid()}.tmp")
            staging.write_text(json.dumps(self.entries))
            os.replace(staging, self.location)
        except OSError:  # a read-only home: the next start reads the files again
            pass


def fingerprint_folder(folder: str | Path, revision: str | None = None,
                       cache: FingerprintCache | None = None) -> ModelFingerprint:
    root = Path(folder)
    cache = cache if cache is not None else FingerprintCache.default()
    files = {path.relative_to(root).as_posix(): cache.digest(path) for path in model_files(root)}
    cache.save()
    if not files:
        raise FileNotFoundError(f"{root} holds no model files")
    overall = hashlib.sha256()
    for name, digest in files.items():
        overall.update(f"{name}\0{digest}\n".encode())
    return ModelFingerprint(digest=f"sha256:{overall.hexdigest()}", files=files, revision=revision)


def read_fingerprint(path: str) -> ModelFingerprint | None:
    """A fingerprint as `ModelFingerprint.to_json` wrote it (a boundary's record, an
    exported adapter's), or None when there is none."""
    try:
        with fsspec.open(path, "r") as handle:
            return ModelFingerprint.from_json(json.load(handle))
    except FileNotFoundError:
        return None

