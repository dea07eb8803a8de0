"""Process-level settings every role applies when it starts."""

from __future__ import annotations

import torch


def configure_torch_threads(threads: int) -> None:
    """One thread per role on a 2-core machine: with two, a training step's time varied
    a hundredfold; with one it is stable (DESIGN.md, "Facts measured")."""
    torch.set_num_threads(threads)
