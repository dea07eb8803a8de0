"""The trackers people already use, fed from the same records as metrics.jsonl (S-OPS-3).

Every numeric key of a metrics.jsonl row is one scalar stepped by its `iteration`. A
resumed run draws each step once with the values metrics.jsonl keeps, which each tracker
needs its own way to honour (TensorBoard's `purge_step`, a whole W&B offline run per
attempt, a fresh MLflow run); docs/prefect-ui.md "TensorBoard, W&B, MLflow" explains why.
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from configs.schema import PPOConfig
from configs.tracker_packages import missing_tracker_packages, tracker_message
from rundir.run_lock import local_run_dir
from rundir.run_outputs import RunPaths, read_metrics


class Tracker(Protocol):
    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


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
    """One offline W&B run per attempt, holding the run's whole curve so far."""

    def __init__(self, config: PPOConfig, paths: RunPaths, committed: list[Mapping[str, Any]]):
        import wandb

        run_dir = local_run_dir(paths.run_dir).resolve()  # W&B writes local files only
        _set_aside_offline_runs(f"{run_dir}/wandb")
        # No resume: offline mode cannot resume; the same id makes a later sync replace
        # the earlier upload of this run with this attempt's whole curve.
        self.run = wandb.init(
            mode="offline", dir=str(run_dir), project="ppo", name=config.job.name, id=_stable_id(paths.run_dir),
            config=config.model_dump(mode="json"),
        )
        for record in committed:
            self.log(int(record["iteration"]), scalars_of(record))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


def _set_aside_offline_runs(wandb_dir: str) -> None:
    """Earlier attempts' offline runs move to `earlier_attempts/` (kept, not deleted),
    so `wandb sync <run>/wandb/offline-run-*` finds only the whole, newest one."""
    earlier = sorted(glob.glob(f"{wandb_dir}/offline-run-*"))
    if earlier:
        os.makedirs(f"{wandb_dir}/earlier_attempts", exist_ok=True)
    for path in earlier:
        os.replace(path, f"{wandb_dir}/earlier_attempts/{os.path.basename(path)}")


CAUGHT_UP = "ppo.caught_up"  # MLflow run tag: every committed row was logged into it


class MlflowTracker:
    """One active MLflow run per run directory, in the run directory's own store."""

    def __init__(self, config: PPOConfig, paths: RunPaths, first_step: int, committed: list[Mapping[str, Any]]):
        from mlflow.tracking import MlflowClient

        run_dir = local_run_dir(paths.run_dir).resolve()  # SQLite needs a local path
        self.client = MlflowClient(tracking_uri=f"sqlite:///{run_dir}/mlflow.db")
        experiment = self.client.get_experiment_by_name("ppo")
        experiment_id = (
            experiment.experiment_id
            if experiment
            # Without a location MLflow puts artifacts under the working directory.
            else self.client.create_experiment("ppo", artifact_location=f"{run_dir}/mlruns")
        )
        current = _caught_up_run(self.client, experiment_id)
        last_logged = -1 if current is None else _last_step(self.client, current)
        if current is not None and last_logged < first_step:
            self.run_id = current  # a clean resume: continue the same run
            self._log_rows([r for r in committed if int(r["iteration"]) > last_logged])
        else:
            # Fresh, or a killed attempt logged steps that run again: a point cannot be
            # removed, so the committed rows go to a new run and the old one is deleted.
            self.run_id = self.client.create_run(experiment_id, run_name=config.job.name).info.run_id
            self._log_rows(committed)
            self.client.set_tag(self.run_id, CAUGHT_UP, "true")
        _delete_other_runs(self.client, experiment_id, keep=self.run_id)

    def _log_rows(self, records: list[Mapping[str, Any]]) -> None:
        for record in records:
            self.log(int(record["iteration"]), scalars_of(record))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items() if not math.isnan(value)]
        for begin in range(0, len(metrics), 1000):  # log_batch takes at most 1,000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[begin : begin + 1000])

    def close(self) -> None:
        pass  # the run stays open: a resumed attempt continues it


def _caught_up_run(client: Any, experiment_id: str) -> str | None:
    """The newest active run that holds every committed row; a run without the tag is
    a copy a crash interrupted."""
    from mlflow.entities import ViewType

    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`{CAUGHT_UP}` = 'true'", run_view_type=ViewType.ACTIVE_ONLY,
        order_by=["attributes.start_time DESC"],
    )
    return runs[0].info.run_id if runs else None


def _last_step(client: Any, run_id: str) -> int:
    """The highest step of any key: keys such as `val/*` are not logged every iteration."""
    keys = client.get_run(run_id).data.metrics
    return max((m.step for key in keys for m in client.get_metric_history(run_id, key)), default=-1)


def _delete_other_runs(client: Any, experiment_id: str, keep: str) -> None:
    """One active run per run directory: superseded and half-copied runs are deleted
    (a soft delete: `mlflow runs restore` brings one back)."""
    from mlflow.entities import ViewType

    for run in client.search_runs([experiment_id], run_view_type=ViewType.ACTIVE_ONLY):
        if run.info.run_id != keep:
            client.delete_run(run.info.run_id)


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
    # Called after the resume rewound metrics.jsonl: it holds exactly the committed rows.
    committed = read_metrics(paths.metrics)
    opened: list[Tracker] = []
    for name in config.job.trackers:
        if name == "tensorboard":
            opened.append(TensorBoardTracker(paths.tensorboard, first_step))
        elif name == "wandb":
            opened.append(WandbTracker(config, paths, committed))
        elif name == "mlflow":
            opened.append(MlflowTracker(config, paths, first_step, committed))
    return Trackers(opened)
