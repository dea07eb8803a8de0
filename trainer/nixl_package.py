"""Which NIXL package this machine has, asked without importing torch so that the
preflight can refuse `rl.weight_sync_transport=nixl` before anything starts."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

MODULES = ("nixl_cu12", "nixl_cu13", "nixl")  # the CUDA-variant wheels, then the meta package


def nixl_module() -> ModuleType:
    """The installed NIXL Python package; ImportError names what is missing."""
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")  # its INFO lines would fill every actor's log
    errors = []
    for name in MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as error:  # absent, or present but its native library does not load
            errors.append(f"{name}: {error}")
    raise ImportError("NIXL does not load here (" + "; ".join(errors) + "); install it with pip install nixl-cu12")


def unavailable_reason() -> str | None:
    """Why this machine cannot run the NIXL transport, or None. Imports the package
    (and so its native library) but creates no agent, so nothing listens."""
    try:
        nixl_module()
    except ImportError as error:
        return str(error)
    return None
