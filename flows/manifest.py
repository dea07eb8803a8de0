"""`--validate-manifest`: check a run without allocating workers or GPUs (S-RUN-3).

This first version checks the typed config only; placement, reward-vs-data and
storage checks are tracked in the launch issue.
"""

from __future__ import annotations

import sys

from configs.loading import ConfigError, load_config


def validate_manifest(profile: str, overrides: list[str]) -> int:
    try:
        config = load_config(profile, overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"profile: {profile}")
    print(f"model: {config.model.path} ({config.model.dtype}); rollout engine: {config.rl.rollout.engine}")
    print(f"grid: backend={config.grid.backend} placement={config.grid.gpu_placement} gpus={config.grid.gpus_per_node}")
    print("bind_check: ok")
    return 0
