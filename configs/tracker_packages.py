"""Whether the packages of the trackers a config lists are installed: a question the
pre-flight asks before anything starts and the trackers ask again as they open, both
answered here without importing any of them."""

from __future__ import annotations

import importlib.util

REQUIRES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}  # tracker -> the module it needs


def missing_tracker_packages(trackers: list[str]) -> list[str]:
    """Trackers chosen whose package cannot be imported here (found without importing it)."""
    return [name for name in trackers if importlib.util.find_spec(REQUIRES[name]) is None]


def tracker_message(missing: list[str]) -> str:
    """`wandb` and `mlflow` are extras of the project; `tensorboard` is in the default install."""
    names = ", ".join(missing)
    install = " ".join(f"'ppo-flow[{name}]'" if name != "tensorboard" else "tensorboard" for name in missing)
    return (
        f"job.trackers: lists {names}, but the package is not installed here; pip install {install}, "
        f"or remove {names} from job.trackers"
    )
