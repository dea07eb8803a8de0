"""Which NIXL package this machine has, asked without importing torch so that the
preflight can refuse `rl.weight_sync_transport=nixl` before anything starts."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

# NIXL's CUDA builds, then its meta package. Each install path has one build: the CPU lock
# nixl-cu12, the GPU lock nixl-cu13 (for the CUDA 13 runtime of PyPI's torch 2.13.0), so
# the CUDA 13 build comes first where `pip install .[gpu]` added it beside the other.
MODULES = ("nixl_cu13", "nixl_cu12", "nixl")


def nixl_module() -> ModuleType:
    """The installed NIXL Python package; ImportError names what is missing."""
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")  # its INFO lines would fill every actor's log
    errors = []
    for name in MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as error:  # absent, or present but its native library does not load
            errors.append(f"{name}: {error}")
    raise ImportError(
        "NIXL does not load here (" + "; ".join(errors) + "); install the build for torch's CUDA: "
        "pip install nixl-cu13 (CUDA 13) or nixl-cu12 (CUDA 12, or no GPU)"
    )


def unavailable_reason() -> str | None:
    """Why this machine cannot run the NIXL transport, or None. Imports the package
    (and so its native library) but creates no agent, so nothing listens."""
    try:
        nixl_module()
    except ImportError as error:
        return str(error)
    return None
