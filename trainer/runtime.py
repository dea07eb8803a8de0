"""Process-level settings every role applies when it starts."""

from __future__ import annotations

import torch


def configure_torch_threads(threads: int) -> None:
    """One thread per role on a 2-core machine: with two, a training step here varied
    from 0.06 s to 6.6 s; with one it is stable (measured, see DESIGN.md)."""
    torch.set_num_threads(threads)
