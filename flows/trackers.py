"""The trackers people already use, fed from the same records as metrics.jsonl (S-OPS-3).

`job.trackers` names them: `tensorboard` (the default: event files under
`<run>/tensorboard/`, so `tensorboard --logdir <output_root>` shows every run),
`wandb` (offline, under `<run>/wandb/`, synced later with `wandb sync`) and `mlflow`
(a local file store, `<run>/mlruns/`). Every numeric key of a metrics.jsonl row is
one scalar, stepped by the row's `iteration`; critic-warmup iterations carry
`train/actor_warmup` = 1.0, which marks them on every tracker.

A resumed run continues the same curves. TensorBoard is told the first step this
process writes (`purge_step`), so the steps a killed attempt wrote after its last
boundary are hidden rather than drawn twice; W&B resumes the same run id and ignores
steps it has already seen; MLflow continues the same run id (its file store has no
way to drop a logged point, so replayed iterations appear twice there).

W&B and MLflow are optional extras (`pip install 'ppo-flow[wandb]'`, `[mlflow]`);
choosing one that is not installed is refused before the run starts
(flows/preflight.py, `tracker_problems`), naming `job.trackers`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import fsspec

from configs.schema import PPOConfig
from flows.run_outputs import RunPaths

REQUIRES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}  # tracker -> the module it needs


class Tracker(Protocol):
    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


def missing_tracker_packages(trackers: list[str]) -> list[str]:
    """Trackers chosen whose package cannot be imported here (found without importing it)."""
    return [name for name in trackers if importlib.util.find_spec(REQUIRES[name]) is None]


def scalars_of(record: Mapping[str, Any]) -> dict[str, float]:
    """Every numeric key but the step itself; booleans count as numbers, NaN stays NaN."""
    numeric = (int, float)
    return {key: float(value) for key, value in record.items() if key != "iteration" and isinstance(value, numeric)}


class TensorBoardTracker:
    def __init__(self, log_dir: str, first_step: int):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events a killed attempt wrote at or after this step are hidden by
        # TensorBoard, so a resumed run draws each step once.
        self.writer = SummaryWriter(log_dir=log_dir, purge_step=first_step)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a user watching the run sees each iteration as it ends

    def close(self) -> None:
        self.writer.close()


def _stable_id(run_dir: str) -> str:
    """The same id for every attempt of one run directory: resumed runs continue it."""
    return hashlib.sha1(run_dir.encode()).hexdigest()[:16]


class WandbTracker:
    def __init__(self, config: PPOConfig, paths: RunPaths):
        import wandb

        self.run = wandb.init(
            mode="offline", dir=paths.run_dir, project="ppo", name=config.job.name, id=_stable_id(paths.run_dir),
            resume="allow", config=config.model_dump(mode="json"),
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, config: PPOConfig, paths: RunPaths):
        from mlflow.tracking import MlflowClient

        store = f"{paths.run_dir}/mlruns"
        self.client = MlflowClient(tracking_uri=f"file://{store}" if "://" not in store else store)
        experiment = self.client.get_experiment_by_name("ppo")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("ppo")
        id_file = f"{store}/ppo_run_id.txt"
        fs, id_path = fsspec.core.url_to_fs(id_file)
        if fs.exists(id_path):
            self.run_id = fs.cat_file(id_path).decode().strip()
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=config.job.name).info.run_id
            fs.pipe_file(id_path, self.run_id.encode())

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items() if not math.isnan(value)]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        pass  # the run stays open: a resumed attempt continues it


@dataclass
class Trackers:
    """The run's trackers, fed one metrics.jsonl record at a time."""

    trackers: list[Tracker] = field(default_factory=list)

    def log(self, record: Mapping[str, Any]) -> None:
        scalars = scalars_of(record)
        for tracker in self.trackers:
            tracker.log(int(record["iteration"]), scalars)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def open_trackers(config: PPOConfig, paths: RunPaths, first_step: int) -> Trackers:
    """`first_step`: the first iteration this process writes (0 with a before-training
    evaluation, else the iteration after the resume boundary)."""
    missing = missing_tracker_packages(config.job.trackers)
    if missing:
        raise RuntimeError(tracker_message(missing))
    opened: list[Tracker] = []
    for name in config.job.trackers:
        if name == "tensorboard":
            opened.append(TensorBoardTracker(paths.tensorboard, first_step))
        elif name == "wandb":
            opened.append(WandbTracker(config, paths))
        elif name == "mlflow":
            opened.append(MlflowTracker(config, paths))
    return Trackers(opened)


def tracker_message(missing: list[str]) -> str:
    """`wandb` and `mlflow` are extras of the project; `tensorboard` is in the default install."""
    names = ", ".join(missing)
    install = " ".join(f"'ppo-flow[{name}]'" if name != "tensorboard" else "tensorboard" for name in missing)
    return (
        f"job.trackers: lists {names}, but the package is not installed here; pip install {install}, "
        f"or remove {names} from job.trackers"
    )
