"""The folders whose modules a run's config values may name by bare name (S-BYO-3): the
profile's own folder, outside the project's configs/. They are resolved once, when the
run is launched (flows/launch.py), and handed on explicitly: to the environment of the
processes the run starts (processes/ray_session.py `worker_env`), and to this module's
`use_code_dirs`, which puts them on a process's path once, when the process loads its
profile or builds a role that imports named code.

Appended to `sys.path`, never put on PYTHONPATH: a `profile.py` beside the profile must
not stand in for the standard library's `profile` module (which torch imports), nor a
`data/` folder for the project's own package (configs/profile_folder.py notes both).

Imports nothing heavy: config loading and the role bodies both use it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path

CODE_DIRS_ENV = "PPO_LAUNCH_CODE_DIRS"
"""Set by the launch, never by an operator: the run's code folders, in the environment
of the processes of a Ray the run starts (whose nodes share this machine's files)."""

SHIPPED_CODE_ENV = "PPO_SHIPPED_CODE"
"""Set by the launch on a joined cluster: the package names under which the run's code
folders were shipped with Ray's runtime_env (processes/code_shipping.py)."""

CONFIGS_DIR = Path(__file__).resolve().parent


def code_dirs_of(profile: str | Path) -> tuple[str, ...]:
    """The run's code folders: the profile's own folder, unless it is the project's
    configs/ (a package of the project, importable as `configs.`)."""
    folder = Path(profile).resolve().parent
    return () if folder == CONFIGS_DIR else (str(folder),)


def use_code_dirs(dirs: Iterable[str]) -> None:
    """Make the modules in `dirs` importable by bare name in this process: appended to
    its path, each once."""
    for entry in dirs:
        if entry and entry not in sys.path:
            sys.path.append(entry)


def use_run_code_dirs() -> None:
    """In a process the run started (a role actor): the code folders its launch handed
    down. On a joined cluster these are the shipped copies Ray unpacked on this node,
    found by package name; elsewhere the folders themselves."""
    use_code_dirs(entry for entry in os.environ.get(CODE_DIRS_ENV, "").split(os.pathsep))
    use_code_dirs(_shipped_folder(name) for name in os.environ.get(SHIPPED_CODE_ENV, "").split(os.pathsep) if name)


def _shipped_folder(name: str) -> str:
    """Where Ray unpacked the shipped package `name` on this node. Found, not imported:
    the folder's own `__init__.py` (if any) must not run as a package of that name."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModuleNotFoundError(
            f"the run's code folder shipped as {name!r} is not on this node's path (Ray's runtime_env py_modules)",
            name=name,
        )
    return locations[0]
