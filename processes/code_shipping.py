"""The run's code folders (S-BYO-3) shipped to a joined cluster's nodes with Ray's own
runtime_env, so that a node that lacks their paths still imports the modules a config
value names (docs/launch.md, "Your code on a joined cluster").

Why `py_modules` of a wrapper and not `working_dir` or the folder itself: Ray puts
every `py_modules` entry (and a `working_dir`) *first* on a worker's PYTHONPATH, before
the standard library and the project, and unpacks a directory entry as a package named
after the directory. The folder beside a profile holds loose modules, possibly one
named like a standard module (`profile.py`) or a project package (`data/`); first on
the path, those would break every actor. So each folder's Python code is copied into a
package of a name nothing else uses (`ppo_code_<digest>`), which is all that comes
first on the path; the role that imports named code finds where Ray unpacked it and
appends that folder to its path (configs/code_folders.py `use_run_code_dirs`), exactly
as it appends the folder itself on a Ray of the run's own.

What ships: the folder's `*.py` files and its package folders (folders named like a
module that hold `.py` files), whole but for `__pycache__`: data, outputs and models
next to the profile stay behind, and Ray's limit on an upload (512 MiB, warned from half that) is never near.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

SHIPPED_PREFIX = "ppo_code_"


def shipped_name(folder: str) -> str:
    """The package name a code folder ships under: one per folder path."""
    return SHIPPED_PREFIX + hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]


def copy_code(folder: Path, into: Path) -> None:
    """The Python code of `folder` (its modules and package folders) into `into`."""
    into.mkdir(parents=True)
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and entry.suffix == ".py":
            shutil.copy2(entry, into / entry.name)
        elif entry.is_dir() and entry.name.isidentifier() and any(entry.glob("*.py")):
            shutil.copytree(entry, into / entry.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


@contextlib.contextmanager
def shipped_code(code_dirs: Sequence[str]) -> Iterator[tuple[list[str], list[str]]]:
    """(`py_modules` entries, their package names) for `code_dirs`, staged in a temporary
    folder while the caller's `ray.init` uploads them (Ray keeps the upload in the
    cluster's own storage; the staged copy is removed afterwards)."""
    if not code_dirs:
        yield [], []
        return
    staging = Path(tempfile.mkdtemp(prefix="ppo-code-"))
    try:
        entries, names = [], []
        for folder in code_dirs:
            name = shipped_name(folder)
            copy_code(Path(folder), staging / name)
            entries.append(str(staging / name))
            names.append(name)
        yield entries, names
    finally:
        shutil.rmtree(staging, ignore_errors=True)
