"""Process-level settings every role applies when it starts."""

from __future__ import annotations

import torch


def configure_torch_threads(threads: int) -> None:
    """One thread per role on a machine with few cores: roles whose threads compete for
    them make a training step's time erratic (DESIGN.md, "Facts measured")."""
    torch.set_num_threads(threads)
